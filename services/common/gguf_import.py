"""A GGUF file (llama.cpp's format) to an ordinary Hugging Face model directory, which every part of
rollway loads with `from_pretrained`: the trainer, the hf engine, SGLang and the exports.

transformers reads GGUF itself (with the `gguf` package) and dequantizes the tensors, but a model
loaded that way refuses `save_pretrained` ("quantized with gguf and not serializable"). So the
weights are moved into a model built from the same config without its quantization_config, the
embeddings tied again where the config ties them (stored once), and saved with the tokenizer, its
chat template and the generation config. The directory is checked by loading it back: its logits
on a probe text must equal the GGUF model's.

Quantized files give the dequantized weights (e.g. Q4_1's), not the original release's.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path

GGUF_MAGIC = b"GGUF"
PROBE_TEXT = "The capital of France is"
# The saved model must reproduce the GGUF model's logits: both are the same fp32 tensors.
MAX_LOGIT_DIFFERENCE = 1e-4


class GgufImportError(ValueError):
    """The file cannot be converted; the message names why."""


def import_gguf(gguf_file: Path, out_dir: Path) -> dict:
    """Convert `gguf_file` into `out_dir` (which must not hold files yet); returns what was written:
    architecture, parameters, vocabulary, whether embeddings are tied, and the probe's logit
    difference between the GGUF model and the directory."""
    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    _check_gguf_file(gguf_file)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise GgufImportError(f"{out_dir} is not empty: give a new directory")
    import torch

    tokenizer, model = _load_gguf(gguf_file)
    plain = _plain_copy(model)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would keep other users (a container's) out
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        difference = _probe_difference(model, tokenizer, staging)
        if difference > MAX_LOGIT_DIFFERENCE:
            raise GgufImportError(
                f"{gguf_file.name}: the saved model's logits differ from the GGUF model's by {difference:.3g}"
            )
        if out_dir.exists():
            out_dir.rmdir()
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    config = plain.config
    return {
        "architecture": type(plain).__name__,
        "num_parameters": sum(p.numel() for p in plain.parameters()),  # tied tensors once
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "dtype": str(torch.float32).removeprefix("torch."),
        "max_logit_difference": difference,
        "out_dir": str(out_dir),
    }


def _check_gguf_file(path: Path) -> None:
    if not path.is_file():
        raise GgufImportError(f"{path}: no such file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GgufImportError(f"{path}: not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")


def _load_gguf(path: Path):
    """The tokenizer and the dequantized fp32 model, as transformers reads them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except ImportError as exc:  # the gguf package (rollway's ml extra pins it)
        raise GgufImportError(f"reading GGUF needs the `gguf` package: {exc}") from None
    except (ValueError, KeyError, NotImplementedError, IndexError, struct.error) as exc:
        # transformers names what it cannot read: "GGUF model with architecture X is not supported
        # yet", an unknown tensor type, a missing metadata key; gguf's reader a truncated file.
        raise GgufImportError(
            f"{path.name}: transformers cannot convert it: {exc}{_readable_hint(exc)}"
        ) from None
    return tokenizer, model.eval()


def _readable_hint(exc: Exception) -> str:
    """For an architecture transformers cannot read, the ones it can: what to look for instead."""
    if "architecture" not in str(exc):
        return ""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # The mapping's keys also hold its metadata sections, which are no architectures.
    readable = ", ".join(sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}))
    return f" (transformers {transformers.__version__} reads GGUF files of: {readable})"


def _plain_copy(model):
    """The same weights in a model without GGUF's quantization_config (which refuses saving)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain.eval()


def _probe_difference(model, tokenizer, saved_dir: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(saved_dir, dtype=torch.float32).eval()
    ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        return float((model(ids).logits - saved(ids).logits).abs().max())
