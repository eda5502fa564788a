"""How much memory a model's trainer will take, estimated before it starts (the gateway refuses
a model that would not fit instead of letting a trainer die loading it), and how many positions it
takes (a longer datum is refused before it reaches the trainer).

A trainer's memory is the run planner's (plan.memory.trainer_rank_memory, calibrated against
measured peaks): the gateway's trainer is one rank, with the trainer's default micro-batch token
budget, so it refuses no model that `rollway run` would accept with those settings. LoRA models of
one base share a trainer: the base is counted once, each model adds its adapters (weights,
gradients and AdamW's two moments, and the copy kept while another tenant's are live).
"""

from __future__ import annotations

import json
from pathlib import Path

from rollway.coordinator.plan.memory import lora_params, trainer_rank_memory
from rollway.coordinator.plan.shape import read_model_shape
from rollway.trainer.config import TrainerConfig

ADAPTER_COPIES = 5  # fp32: weights, gradients, AdamW's two moments, the copy kept while swapped out


def trainer_config(model_dir: Path, lora_rank: int, dtype: str) -> TrainerConfig:
    """The settings the gateway starts a model's trainer with (tenants.trainer_group)."""
    return TrainerConfig(hf_checkpoint=str(model_dir), world_size=1, dtype=dtype, lora_rank=lora_rank)


def trainer_bytes(model_dir: Path, lora_rank: int, dtype: str = "float32") -> int:
    """Estimated peak memory of one trainer training this model (host memory: the gateway's budget)."""
    trainer = trainer_config(model_dir, lora_rank, dtype)
    shape = read_model_shape(str(model_dir))
    return trainer_rank_memory(shape, trainer, trainer.max_tokens_per_gpu, on_gpu=False).peak


def adapter_bytes(model_dir: Path, lora_rank: int) -> int:
    """Estimated memory one LoRA tenant adds to a shared trainer: its adapters (peft's all-linear,
    as the planner counts them), ADAPTER_COPIES fp32 copies each."""
    shape = read_model_shape(str(model_dir))
    return lora_params(shape, lora_rank, ["all-linear"]) * 4 * ADAPTER_COPIES


def max_context_length(model_dir: Path) -> int | None:
    """The most positions the model takes, from its config (None: the config names no limit)."""
    config = json.loads((model_dir / "config.json").read_text())
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(config.get(name), int):
            return config[name]
    return None
