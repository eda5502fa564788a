"""Losses by `--loss-type`, and how per-token terms become one number per optimizer step.

A loss function gets a micro-batch's per-target tensors (LossInputs) and returns per-token
terms; the term "loss" is optimised, the others are reported as train/<name>. Aggregation is
shared by every loss and uses denominators of the whole global batch (all micro-batches on all
ranks), so summing micro-batch contributions gives the same value and gradients however the batch
is split:

    per-sample (default):      sum_i (sum_t term_it * m_it / n_i) / num_samples
    --calculate-per-token-loss: sum_it term_it * m_it / num_loss_tokens

A policy loss plugs in with `@register_loss("policy_loss", per_token_inputs=("advantages",
"old_log_probs"))`: the listed Sample fields are validated, packed and passed in `extras`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rollway.trainer.config import TrainerConfig


@dataclass
class LossInputs:
    """A micro-batch's tensors at target positions ([rows, length])."""

    log_probs: torch.Tensor  # log p(target) under the current policy (requires grad)
    loss_mask: torch.Tensor  # float
    sample_index: torch.Tensor  # request index of the owning sample, -1 for none
    settings: TrainerConfig
    entropy: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # per-token inputs by Sample field


LossFn = Callable[[LossInputs], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: its function and the per-token inputs it needs."""

    fn: LossFn
    per_token_inputs: tuple[str, ...] = ()
    needs_entropy: bool = False


LOSSES: dict[str, LossSpec] = {}


def register_loss(name: str, per_token_inputs: tuple[str, ...] = (), needs_entropy: bool = False):
    """Decorator: make `fn` the loss of `--loss-type name`."""

    def register(fn: LossFn) -> LossFn:
        LOSSES[name] = LossSpec(fn, tuple(per_token_inputs), needs_entropy)
        return fn

    return register


def get_loss(name: str) -> LossSpec:
    if name not in LOSSES:
        raise KeyError(f"loss_type: unknown {name!r}, expected one of {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


@register_loss("sft_loss")
def sft_loss(inputs: LossInputs) -> dict[str, torch.Tensor]:
    """Negative log-likelihood of the target tokens."""
    return {"loss": -inputs.log_probs}


@dataclass(frozen=True)
class GlobalDenominators:
    """Sizes of the whole global batch of one optimizer step (all ranks, all micro-batches)."""

    num_samples: int
    num_loss_tokens: int


def aggregate(
    term: torch.Tensor,
    loss_mask: torch.Tensor,
    sample_index: torch.Tensor,
    denominators: GlobalDenominators,
    per_token: bool,
) -> torch.Tensor:
    """This micro-batch's share of the global loss (see the module docstring)."""
    masked = term * loss_mask
    if per_token:
        return masked.sum() / max(denominators.num_loss_tokens, 1)
    # Each sample lies inside one micro-batch, so its token count is known locally.
    valid = sample_index >= 0
    if not bool(valid.any()):
        return masked.sum() * 0.0
    index = torch.where(valid, sample_index, 0)
    counts = torch.zeros(int(index.max()) + 1, dtype=loss_mask.dtype, device=loss_mask.device)
    counts.scatter_add_(0, index.reshape(-1), (loss_mask * valid).reshape(-1))
    per_position = counts[index].clamp(min=1.0)
    return (masked / per_position).sum() / max(denominators.num_samples, 1)


# Registers policy_loss (it imports this module's names, so it comes last).
from rollway.trainer import policy_loss as _policy_loss  # noqa: E402, F401
