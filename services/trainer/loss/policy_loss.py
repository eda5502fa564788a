"""`--loss-type policy_loss`: the PPO clipped objective with Miles' options, per token.

    log r   = logp - old_logp                  per token (gspo: the sample's mean over its loss tokens)
    ratio   = exp(clamp(log r, -20, 20))
    pg      = max(-ratio * A, -clip(ratio, 1 - eps_clip, 1 + eps_clip_high) * A)
    dual    = min(pg, -eps_clip_c * A) where A < 0            (--eps-clip-c)
    pg     *= n_i / rollout_max_response_len      dr_grpo: sample i's token sum over a constant length
    pg     *= rollout-correction weight            (--use-tis / --use-mis / --use-geo-mask: rollout_correction.py)
    loss    = pg - entropy_coef * entropy + kl_loss_coef * kl(logp, ref_logp)  (--use-kl-loss)

Non-finite inputs follow Miles (non_finite.py): a NaN or +-inf ppo_kl = old - logp (gspo: of the
sample's mean), advantage or KL term counts as 0 on its token, and is counted in
train/num_non_finite_tokens.

old_logp is the trainer's own no-grad forward before the first optimizer step of the rollout
(policy_inputs.py), the rollout's log-probs with --use-rollout-logprobs, or - when the rollout
makes a single optimizer step and nothing else needs it - the current log-probs detached, which
is the same number without the extra forward. Every term is per token; the engine aggregates
them all the same way (losses.aggregate) and reports each as train/<name>. Registered as
`--loss-type policy_loss` in losses.LOSSES.
"""

from __future__ import annotations

import torch

from rollway.trainer.loss.kl import approx_kl
from rollway.trainer.loss.loss_inputs import LossInputs
from rollway.trainer.loss.non_finite import finite_log_ratio, non_finite_tokens, zero_non_finite
from rollway.trainer.loss.rollout_correction import per_sample_totals, rollout_correction

LOG_RATIO_CLAMP = 20.0


def clipped_policy_loss(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss and clip indicator (1 where the clipped branch is the larger loss)."""
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).float()
    if eps_clip_c is not None:
        dual = torch.minimum(loss, -eps_clip_c * advantages)
        loss = torch.where(advantages < 0, dual, loss)
    return loss, clipfrac


def per_sample_mean(
    values: torch.Tensor, loss_mask: torch.Tensor, sample_index: torch.Tensor
) -> torch.Tensor:
    """Each position gets the mean of `values` over its sample's loss tokens (differentiable)."""
    sums, counts = per_sample_totals(values, loss_mask, sample_index)
    return sums / counts.clamp(min=1.0)


def old_log_probs(inputs: LossInputs) -> torch.Tensor:
    """The old policy's log-probs the ratio is taken against (see the module docstring)."""
    extras = inputs.extras
    if inputs.settings.use_rollout_logprobs:
        return extras["rollout_log_probs"]
    if "old_log_probs" in extras:
        return extras["old_log_probs"]
    return inputs.log_probs.detach()


def mismatch_terms(train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Train/inference mismatch: |train - rollout| and KL(rollout || train) as low_var_kl (Miles:
    k3 of the clamped log-ratio, itself clamped, so one wild token cannot swamp the metric)."""
    abs_diff = (train_log_probs - rollout_log_probs).abs()
    return {
        "train_rollout_logprob_abs_diff": torch.nan_to_num(abs_diff, nan=0.0, posinf=0.0, neginf=0.0),
        "train_rollout_kl": approx_kl(rollout_log_probs, train_log_probs, "low_var_kl"),
    }


def kl_loss_term(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL to the reference. k1/k2/k3 of a non-finite log-ratio is 0 (Miles zeroes it),
    computed from a zeroed log-ratio so its backward stays finite; low_var_kl clamps instead."""
    if kl_type == "low_var_kl":
        return approx_kl(log_probs, ref_log_probs, kl_type)
    log_ratio, _ = finite_log_ratio(log_probs.float() - ref_log_probs.float())
    kl = approx_kl(log_ratio, torch.zeros_like(log_ratio), kl_type)
    return torch.nan_to_num(kl, nan=0.0, posinf=0.0, neginf=0.0)  # k3 overflows past ~88


def policy_loss(inputs: LossInputs) -> dict[str, torch.Tensor]:
    """Per-token terms of the policy loss (see the module docstring)."""
    s = inputs.settings
    logp, extras = inputs.log_probs, inputs.extras
    mask = inputs.loss_mask
    old = old_log_probs(inputs)
    rollout = extras.get("rollout_log_probs")
    ref = extras.get("ref_log_probs") if s.use_kl_loss else None
    num_non_finite = non_finite_tokens(logp, old, extras["advantages"], rollout, ref)
    advantages = zero_non_finite(extras["advantages"], mask)
    log_ratio = logp - old
    if s.advantage_estimator == "gspo":
        log_ratio = per_sample_mean(log_ratio, mask, inputs.sample_index)
    # Miles zeroes ppo_kl = -log_ratio before the ratio: a -inf old log-prob gives ratio 1, not e^20.
    log_ratio = zero_non_finite(log_ratio, mask)
    eps_high = s.eps_clip if s.eps_clip_high is None else s.eps_clip_high
    pg_loss, clipfrac = clipped_policy_loss(log_ratio, advantages, s.eps_clip, eps_high, s.eps_clip_c)
    terms: dict[str, torch.Tensor] = {
        "pg_clipfrac": clipfrac,
        "ppo_kl": -log_ratio.detach(),
        "num_non_finite_tokens": num_non_finite,
    }
    if s.advantage_estimator == "dr_grpo":
        _, counts = per_sample_totals(torch.ones_like(pg_loss), inputs.loss_mask, inputs.sample_index)
        pg_loss = pg_loss * (counts / s.rollout_max_response_len)
    if rollout is not None:
        # The trainer's view of the rollout policy: its own old log-probs when it computed them.
        train_logp = extras.get("old_log_probs", logp.detach())
        terms.update(mismatch_terms(train_logp, rollout))
        weight, correction_terms = rollout_correction(
            train_logp, rollout, inputs.loss_mask, inputs.sample_index, s
        )
        if weight is not None:
            pg_loss = pg_loss * weight
        terms.update(correction_terms)
    entropy = inputs.entropy if inputs.entropy is not None else torch.zeros_like(logp)
    loss = pg_loss - s.entropy_coef * entropy
    if s.use_kl_loss:
        kl = zero_non_finite(kl_loss_term(logp, ref, s.kl_loss_type), mask)
        loss = loss + s.kl_loss_coef * kl
        terms["kl_loss"] = kl
    terms.update({"loss": loss, "pg_loss": pg_loss, "entropy_loss": entropy})
    return terms
