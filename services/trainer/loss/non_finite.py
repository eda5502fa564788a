"""Non-finite inputs to the losses: a -inf log-prob (a token the model calls impossible), +inf or
NaN from a broken engine or a corrupted replay. One token like that must not decide a step.

The rule is Miles' (miles/backends/training_utils/loss_hub/losses.py, policy_loss_function):
on loss tokens, a non-finite ppo_kl (old - logp), advantage, KL-loss term or mismatch term counts
as 0, and everything off the loss tokens is 0. So a -inf old log-prob gives the token ratio 1
(not exp(20)) and no gradient. Corrections (rollout_correction.py) give such a token weight 0.
Every loss reports `num_non_finite_tokens`: the loss tokens with any non-finite input.
"""

from __future__ import annotations

import torch


def zero_non_finite(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """`values` with NaN and +-inf set to 0 on loss tokens and everything else 0 (Miles'
    torch.where(active, nan_to_num(x, 0, 0, 0), 0)). The gradient of a zeroed entry is 0."""
    finite = torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.where(loss_mask > 0, finite, torch.zeros_like(finite))


def non_finite_tokens(*inputs: torch.Tensor | None) -> torch.Tensor:
    """1.0 at the positions where any of `inputs` is NaN or +-inf, else 0.0 (the metric's term)."""
    present = [t.detach() for t in inputs if t is not None]
    bad = torch.zeros_like(present[0], dtype=torch.bool)
    for tensor in present:
        bad = bad | ~torch.isfinite(tensor)
    return bad.float()


def finite_log_ratio(log_ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_ratio with its non-finite entries set to 0, the mask of finite entries). Functions of
    the result have a clean backward: exp(inf) in an unused branch would turn 0 * inf into NaN."""
    finite = torch.isfinite(log_ratio)
    return torch.where(finite, log_ratio, torch.zeros_like(log_ratio)), finite
