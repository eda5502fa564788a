"""Build the model on every rank: rank 0 reads the checkpoint once, the others start on meta.

    rank 0:  AutoModelForCausalLM.from_pretrained(fp32) -> full state dict + buffers, then a meta copy
    rank r:  AutoModelForCausalLM.from_config on the meta device
    all:     fully_shard (sharding.py) -> to_empty -> set_model_state_dict(broadcast_from_rank0)
             -> broadcast the buffers (rotary inv_freq is not in the state dict)

Master weights are fp32 whatever the checkpoint's dtype; `--dtype` is the compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.utils import logging as hf_logging

from rollway.trainer.attention import hf_attn_implementation
from rollway.trainer.config import TrainerConfig


class ModelLoadError(RuntimeError):
    """The checkpoint cannot be loaded (missing, unreadable, not a causal LM)."""


@dataclass
class LoadedModel:
    """A model skeleton on the meta device plus (on rank 0) the values to put in it."""

    model: torch.nn.Module
    hf_config: PretrainedConfig
    full_state_dict: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


def read_hf_config(path: str) -> PretrainedConfig:
    """The checkpoint's config, or ModelLoadError naming the directory."""
    if not Path(path, "config.json").is_file():
        raise ModelLoadError(f"hf_checkpoint: no config.json in {path}")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"hf_checkpoint: cannot read the config in {path}: {exc}") from None


def build_meta_model(hf_config: PretrainedConfig, config: TrainerConfig) -> torch.nn.Module:
    """The architecture with fp32 parameters on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            hf_config,
            attn_implementation=hf_attn_implementation(config.attn_implementation),
            dtype=torch.float32,
        )
    return model


def load_model(config: TrainerConfig, rank: int) -> LoadedModel:
    """Rank 0 reads the weights; every rank returns a meta model to be sharded and filled."""
    hf_config = read_hf_config(config.hf_checkpoint)
    loaded = LoadedModel(model=build_meta_model(hf_config, config), hf_config=hf_config)
    if rank == 0:
        hf_logging.disable_progress_bar()  # no progress bars in the service's JSON log
        try:
            source = AutoModelForCausalLM.from_pretrained(
                config.hf_checkpoint,
                attn_implementation=hf_attn_implementation(config.attn_implementation),
                dtype=torch.float32,
            )
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"hf_checkpoint: cannot load {config.hf_checkpoint}: {exc}") from None
        loaded.full_state_dict = source.state_dict()
        loaded.buffers = {name: buf.detach().clone() for name, buf in source.named_buffers()}
        del source
    return loaded


def broadcast_buffers(model: torch.nn.Module, buffers: dict[str, torch.Tensor], device: torch.device) -> None:
    """Give every rank rank 0's buffers (to_empty left them uninitialised), in name order."""
    for name, buf in sorted(model.named_buffers()):
        value = buffers[name].to(device) if dist.get_rank() == 0 else torch.empty_like(buf, device=device)
        dist.broadcast(value, src=0)
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        module._buffers[attr] = value.to(buf.dtype)
