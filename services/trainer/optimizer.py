"""AdamW over the FSDP2 shards, gradient clipping and the learning-rate schedule.

The schedule is a pure function of the optimizer step (Megatron's shapes, counted so that the
first step already trains): step k (0-based) uses

    warmup  (k < W):      lr * (k + 1) / W
    constant:             lr
    linear / cosine:      min_lr + (lr - min_lr) * f(p),  p = (k - W) / (D - W) clipped to [0, 1]
                          f = 1 - p (linear) or (1 + cos(pi p)) / 2 (cosine)

Its state is just the step, which checkpoints store.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from rollway.trainer.config import TrainerConfig


def lr_at(step: int, config: TrainerConfig) -> float:
    """Learning rate of optimizer step `step` (0-based)."""
    warmup = config.lr_warmup_iters
    if warmup > 0 and step < warmup:
        return config.lr * (step + 1) / warmup
    if config.lr_decay_style == "constant":
        return config.lr
    progress = min(max((step - warmup) / max(config.lr_decay_iters - warmup, 1), 0.0), 1.0)
    if config.lr_decay_style == "linear":
        factor = 1.0 - progress
    elif config.lr_decay_style == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"lr_decay_style: unknown {config.lr_decay_style!r}")
    return config.min_lr + (config.lr - config.min_lr) * factor


def build_optimizer(model: torch.nn.Module, config: TrainerConfig) -> torch.optim.AdamW:
    """AdamW on every trainable parameter (fp32 master shards).

    fused: one kernel per parameter for the whole update (what TRL's default `adamw_torch_fused`
    runs) instead of ~8 elementwise ones. The same formula; it rounds differently from torch's
    per-parameter loop, within float32 precision (tests/unit/trainer/test_optimizer.py). Tiny
    model on CPU, the optimizer step: per-parameter loop 6.5 ms, foreach 3.9 ms, fused 2.8 ms.
    """
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=lr_at(0, config),
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
        fused=True,
    )


def apply_settings(optimizer: torch.optim.Optimizer, config: TrainerConfig, step: int) -> float:
    """Set this step's learning rate and the AdamW hyper-parameters; return the lr."""
    lr = lr_at(step, config)
    for group in optimizer.param_groups:
        group["lr"] = lr
        group["betas"] = (config.adam_beta1, config.adam_beta2)
        group["eps"] = config.adam_eps
        group["weight_decay"] = config.weight_decay
    return lr


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Global L2 norm of the gradients over all shards; clip to `max_norm` when it is positive."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)
