"""Build the model on every rank: rank 0 reads the checkpoint once, the others start on meta.

    rank 0:  AutoModelForCausalLM.from_pretrained(fp32) -> full state dict + buffers, then a meta copy
    rank r:  AutoModelForCausalLM.from_config on the meta device
    all:     fully_shard (sharding.py) -> to_empty -> set_model_state_dict(broadcast_from_rank0)
             -> broadcast the buffers (rotary inv_freq is not in the state dict)

Master weights are fp32 whatever the checkpoint's dtype; `--dtype` is the compute dtype.
Dropout is off (every dropout probability of the config and every nn.Dropout set to 0) unless
`keep_dropout`: the rollout engine samples without dropout, so a trainer with dropout would
train a perturbed policy (train/train_rollout_kl > 0 at step 0 and off-policy ratios throughout).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.utils import logging as hf_logging

from rollway.common.log import get_logger
from rollway.common.model_load_log import logged_model_load
from rollway.trainer.attention import hf_attn_implementation
from rollway.trainer.config import TrainerConfig

log = get_logger("rollway.trainer.model_loading")

# Config fields holding a dropout probability across architectures: attention_dropout,
# hidden_dropout, classifier_dropout, summary_first_dropout (GPT-2), resid_pdrop, embd_pdrop, ...
DROPOUT_FIELD = re.compile(r"dropout|pdrop")
_warned_keep_dropout: set[str] = set()  # checkpoints already warned about (once per process)


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


def config_dropouts(hf_config: PretrainedConfig, prefix: str = "") -> dict[str, float]:
    """Every non-zero dropout probability of the config (nested configs included), by field name."""
    found = {}
    for name, value in vars(hf_config).items():
        if isinstance(value, PretrainedConfig):
            found.update(config_dropouts(value, f"{prefix}{name}."))
        elif DROPOUT_FIELD.search(name) and isinstance(value, int | float) and not isinstance(value, bool):
            if value:
                found[prefix + name] = float(value)
    return found


def disable_dropout(hf_config: PretrainedConfig, model: torch.nn.Module | None = None) -> None:
    """Set every dropout probability to 0: in the config before the model is built (modules that
    read it at forward time, e.g. attention_dropout) and in the built model's dropout modules."""
    for name in config_dropouts(hf_config):
        owner = hf_config
        *parents, field_name = name.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, field_name, 0.0)
    if model is not None:
        for module in model.modules():
            if isinstance(module, torch.nn.modules.dropout._DropoutNd):
                module.p = 0.0


def _warn_kept_dropout(config: TrainerConfig, hf_config: PretrainedConfig, model: torch.nn.Module) -> None:
    dropouts = config_dropouts(hf_config)
    modules = sum(
        1 for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
    )
    if (dropouts or modules) and config.hf_checkpoint not in _warned_keep_dropout:
        _warned_keep_dropout.add(config.hf_checkpoint)
        log.warning(
            "keep_dropout: training with dropout; the rollout engine samples without it, so the "
            "trained policy differs from the sampled one (train/train_rollout_kl > 0)",
            dropouts=dropouts,
            num_dropout_modules=modules,
        )


def load_model(config: TrainerConfig, rank: int) -> LoadedModel:
    """Rank 0 reads the weights; every rank returns a meta model to be sharded and filled."""
    hf_config = read_hf_config(config.hf_checkpoint)
    # The model is built from a copy: an HF export keeps the checkpoint's own config.
    model_config = copy.deepcopy(hf_config)
    if not config.keep_dropout:
        disable_dropout(model_config)
    loaded = LoadedModel(model=build_meta_model(model_config, config), hf_config=hf_config)
    if config.keep_dropout:
        if rank == 0:
            _warn_kept_dropout(config, model_config, loaded.model)
    else:
        disable_dropout(model_config, loaded.model)
    if rank == 0:
        hf_logging.disable_progress_bar()  # no progress bars in the service's JSON log
        with logged_model_load(log, config.hf_checkpoint, "float32") as loaded_source:
            try:
                source = AutoModelForCausalLM.from_pretrained(
                    config.hf_checkpoint,
                    attn_implementation=hf_attn_implementation(config.attn_implementation),
                    dtype=torch.float32,
                )
            except (OSError, ValueError) as exc:
                raise ModelLoadError(f"hf_checkpoint: cannot load {config.hf_checkpoint}: {exc}") from None
            loaded_source.append(source)
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
        # nn.Module's setattr replaces a registered buffer in place (persistence unchanged)
        setattr(model.get_submodule(module_name), attr, value.to(buf.dtype))
