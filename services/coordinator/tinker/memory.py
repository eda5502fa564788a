"""How much memory a model's trainer will take, estimated before it starts (the gateway refuses
a model that would not fit instead of letting a trainer die loading it), and how many positions it
takes (a longer datum is refused before it reaches the trainer).

Full fine-tuning holds, per parameter, the weight, its gradient and AdamW's two moments in the
training dtype's master precision (fp32): 16 bytes. LoRA trains adapters only: the frozen weights
(4 bytes each in fp32) plus a small share for the adapters and their optimizer state. LoRA models
of one base share a trainer: the base is counted once, each model adds its adapters (weights,
gradients and AdamW's two moments, and the copy kept while another tenant's are live).
"""

from __future__ import annotations

import json
from pathlib import Path

BYTES_PER_PARAMETER = {"full": 16, "lora": 5}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def num_parameters(model_dir: Path) -> int:
    """Parameters of a local Hugging Face model, from its safetensors files' sizes and dtype."""
    config = json.loads((model_dir / "config.json").read_text())
    stored_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return stored_bytes // DTYPE_BYTES.get(dtype, 4)


def trainer_bytes(model_dir: Path, lora_rank: int) -> int:
    """Estimated memory of one trainer training this model."""
    return num_parameters(model_dir) * BYTES_PER_PARAMETER["lora" if lora_rank else "full"]


def adapter_bytes(model_dir: Path, lora_rank: int) -> int:
    """Estimated memory one LoRA tenant adds to a shared trainer: rank x (in + out) parameters
    for every linear layer of a decoder layer (peft's all-linear), 5 fp32 copies each."""
    config = json.loads((model_dir / "config.json").read_text())
    hidden = int(config.get("hidden_size", 0))
    heads = int(config.get("num_attention_heads", 1))
    head_dim = int(config.get("head_dim") or hidden // max(heads, 1))
    kv = int(config.get("num_key_value_heads") or heads) * head_dim
    inner = int(config.get("intermediate_size", 4 * hidden))
    q = heads * head_dim
    linears = [
        (hidden, q),
        (hidden, kv),
        (hidden, kv),
        (q, hidden),
        (hidden, inner),
        (hidden, inner),
        (inner, hidden),
    ]
    per_layer = sum(lora_rank * (fan_in + fan_out) for fan_in, fan_out in linears)
    return per_layer * int(config.get("num_hidden_layers", 1)) * 4 * 5


def max_context_length(model_dir: Path) -> int | None:
    """The most positions the model takes, from its config (None: the config names no limit)."""
    config = json.loads((model_dir / "config.json").read_text())
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(config.get(name), int):
            return config[name]
    return None
