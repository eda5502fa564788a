"""A decoder's shape from its config.json, never its weights: sizes, and the parameter count
transformers would build (tests/unit/coordinator/test_memory_plan.py checks it on the meta device
for Qwen3, Qwen2 and Llama shapes). No torch here: `rollway plan` stays instant."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Decoder families whose shapes the parameter count below knows: model_type -> (q/k/v biases,
# per-head q/k RMSNorm).
KNOWN_DECODERS = {
    "gemma": (False, False),
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


class ModelShapeError(ValueError):
    """The model's config.json is missing, unreadable, or of an architecture not modelled here."""


@dataclass(frozen=True)
class ModelShape:
    """A Llama/Qwen-style decoder's sizes, as its config.json gives them."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    stored_dtype: str = ""  # the weights' dtype in the checkpoint ("dtype" / "torch_dtype"), if said

    @property
    def num_params(self) -> int:
        """Parameters of the model as transformers builds it (tied embeddings counted once)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
        attention += 2 * self.head_dim if self.qk_norm else 0
        layer = attention + 3 * h * self.intermediate_size + 2 * h  # the MLP and two RMSNorms
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_layers * layer + h  # + the final norm

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache elements per token (keys and values of every layer); times the dtype's bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim


def model_shape(config: dict, source: str = "config.json") -> ModelShape:
    """The decoder shape of a config.json's contents; ModelShapeError names what is missing."""
    config = config.get("text_config") or config
    model_type = str(config.get("model_type", ""))
    if model_type not in KNOWN_DECODERS:
        raise ModelShapeError(
            f"{source}: model_type {model_type or '(none)'!r} has no memory model "
            f"(known: {', '.join(sorted(KNOWN_DECODERS))}); use --ignore-memory-plan to run anyway"
        )
    missing = [k for k in REQUIRED_KEYS if not isinstance(config.get(k), int)]
    if missing:
        raise ModelShapeError(f"{source}: no {', '.join(missing)} (needed to count the parameters)")
    heads = config["num_attention_heads"]
    qkv_bias, qk_norm = KNOWN_DECODERS[model_type]
    return ModelShape(
        model_type=model_type,
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", qkv_bias)),
        qk_norm=qk_norm,
        stored_dtype=str(config.get("dtype") or config.get("torch_dtype") or ""),
    )


def read_model_shape(hf_checkpoint: str) -> ModelShape:
    """The shape of the model in directory `hf_checkpoint`, from its config.json only."""
    if not hf_checkpoint:
        raise ModelShapeError("hf_checkpoint is not set: no model to plan the memory of")
    path = Path(hf_checkpoint, "config.json")
    if not Path(hf_checkpoint).is_dir():
        raise ModelShapeError(f"hf_checkpoint {hf_checkpoint} is not a directory")
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelShapeError(f"hf_checkpoint {hf_checkpoint} has no config.json") from None
    except (OSError, ValueError) as exc:
        raise ModelShapeError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelShapeError(f"{path} is not a model config (a JSON object)")
    return model_shape(config, str(path))
