"""Check an OptimStep request's AdamW hyper-parameters (rank 0, before any rank works)."""

from __future__ import annotations

import math

from rollway.common.errors import InvalidArgument


def adam_settings(request) -> dict:
    """The keyword arguments of TrainerController.optim_step; InvalidArgument names a bad field."""
    checks = {
        "learning_rate": (request.learning_rate, lambda v: v >= 0, "must be >= 0"),
        "beta1": (request.beta1, lambda v: 0 <= v < 1, "must be in [0, 1)"),
        "beta2": (request.beta2, lambda v: 0 <= v < 1, "must be in [0, 1)"),
        "eps": (request.eps, lambda v: v > 0, "must be > 0"),
        "weight_decay": (request.weight_decay, lambda v: v >= 0, "must be >= 0"),
        "grad_clip_norm": (request.grad_clip_norm, lambda v: v >= 0, "must be >= 0 (0: no clipping)"),
    }
    for name, (value, ok, rule) in checks.items():
        if not math.isfinite(value) or not ok(value):
            raise InvalidArgument(name, f"{rule} (got {value})")
    return {
        "learning_rate": request.learning_rate,
        "betas": (request.beta1, request.beta2),
        "eps": request.eps,
        "weight_decay": request.weight_decay,
        "grad_clip_norm": request.grad_clip_norm,
    }
