"""Hugging Face export: safetensors weights, config, generation config and tokenizer files.

Every rank takes part in gathering the full tensors (weights.py); rank 0 writes the files. The
output loads with `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`.
Tied embeddings are written once, as transformers itself saves them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from transformers import PretrainedConfig

from rollway.trainer.weights import iter_full_tensors, weight_names

# Files copied verbatim from the source checkpoint when present.
SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


def export_dtype(hf_config: PretrainedConfig) -> torch.dtype:
    """The dtype the source checkpoint was saved in (fp32 if it does not say)."""
    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def export_hf(model: torch.nn.Module, hf_config: PretrainedConfig, source_dir: str, out_dir: Path) -> None:
    """Every rank: gather the weights; rank 0 writes `out_dir`."""
    dtype = export_dtype(hf_config)
    tensors = {
        name: tensor.contiguous() for name, tensor in iter_full_tensors(model, weight_names(model), dtype)
    }
    if dist.get_rank() != 0:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    hf_config.save_pretrained(out_dir)
    for name in SIDE_FILES:
        source = Path(source_dir, name)
        if source.is_file():
            shutil.copyfile(source, out_dir / name)
