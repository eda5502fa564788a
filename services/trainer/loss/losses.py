"""Losses by `--loss-type`, and how per-token terms become one number per optimizer step.

A loss function gets a micro-batch's per-target tensors (LossInputs) and returns per-token
terms; the term "loss" is optimised, the others are reported as train/<name>. Aggregation is
shared by every loss and uses denominators of the whole global batch (all micro-batches on all
ranks), so summing micro-batch contributions gives the same value and gradients however the batch
is split:

    per-sample (default):      sum_i (sum_t term_it * m_it / n_i) / num_samples
    --calculate-per-token-loss: sum_it term_it * m_it / num_loss_tokens

A reported term whose name ends in _min or _max (the range of a ratio) is instead the smallest or
largest value over the loss tokens of the global batch (metric_share, then combine_shares and
reduce_shares across micro-batches and ranks). A term whose name starts with num_ is a per-token
indicator and is reported as its sum over the loss tokens of the global batch (a count).

The built-in losses are listed in LOSSES below; another one plugs in with
`@register_loss("my_loss", per_token_inputs=("advantages",))`: the listed Sample fields are
validated, packed and passed in `extras` (LossInputs, loss_inputs.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rollway.trainer.loss.loss_inputs import LossInputs
from rollway.trainer.loss.non_finite import non_finite_tokens
from rollway.trainer.loss.policy_loss import policy_loss

LossFn = Callable[[LossInputs], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: its function and the per-token inputs it needs."""

    fn: LossFn
    per_token_inputs: tuple[str, ...] = ()
    needs_entropy: bool = False


def sft_loss(inputs: LossInputs) -> dict[str, torch.Tensor]:
    """Negative log-likelihood of the target tokens. A non-finite log-prob stays in the loss (as
    Miles' sft_loss_function; the step's non-finite grad_norm then skips the update) and is counted."""
    return {"loss": -inputs.log_probs, "num_non_finite_tokens": non_finite_tokens(inputs.log_probs)}


LOSSES: dict[str, LossSpec] = {
    "sft_loss": LossSpec(sft_loss),
    "policy_loss": LossSpec(policy_loss, per_token_inputs=("advantages",), needs_entropy=True),
}


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
    # where, not a product alone: a NaN off the loss tokens (a prompt position) times 0 is NaN.
    masked = torch.where(loss_mask > 0, term * loss_mask, torch.zeros_like(term))
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


def _extreme(name: str) -> str | None:
    return "max" if name.endswith("_max") else "min" if name.endswith("_min") else None


def metric_share(
    name: str,
    term: torch.Tensor,
    loss_mask: torch.Tensor,
    sample_index: torch.Tensor,
    denominators: GlobalDenominators,
    per_token: bool,
) -> torch.Tensor:
    """This micro-batch's share of the reported train/<name>: aggregate(), or its extreme."""
    if name.startswith("num_"):
        return torch.where(loss_mask > 0, term, torch.zeros_like(term)).sum()
    kind = _extreme(name)
    if kind is None:
        return aggregate(term, loss_mask, sample_index, denominators, per_token)
    fill = torch.full_like(term, -math.inf if kind == "max" else math.inf)
    values = torch.where(loss_mask > 0, term, fill)
    return values.max() if kind == "max" else values.min()


def combine_shares(name: str, total: torch.Tensor | None, share: torch.Tensor) -> torch.Tensor:
    """Two micro-batches' shares of one metric: summed, or the extreme of both."""
    if total is None:
        return share
    kind = _extreme(name)
    if kind is None:
        return total + share
    return torch.maximum(total, share) if kind == "max" else torch.minimum(total, share)


def reduce_shares(totals: dict[str, torch.Tensor]) -> dict[str, float]:
    """train/<name> over every rank (a collective): sums in one all-reduce, extremes in another.
    The shares stay on the device until here: one transfer per step, not per micro-batch. An
    extreme with no loss token anywhere is left out."""
    sums = sorted(n for n in totals if _extreme(n) is None)
    extremes = sorted(n for n in totals if _extreme(n) is not None)
    summed = torch.stack([totals[n].float() for n in sums])
    dist.all_reduce(summed)
    metrics = {f"train/{n}": float(v) for n, v in zip(sums, summed.tolist(), strict=True)}
    if extremes:  # every rank reports the same names (same settings), so the collectives match
        signs = torch.tensor([1.0 if _extreme(n) == "max" else -1.0 for n in extremes], device=summed.device)
        largest = torch.stack([totals[n].float() for n in extremes]) * signs
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        for name, value in zip(extremes, (largest * signs).tolist(), strict=True):
            if math.isfinite(value):
                metrics[f"train/{name}"] = value
    return metrics
