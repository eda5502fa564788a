"""KL estimators between the policy and another model, per token (Miles' compute_approx_kl).

With log r = log p_policy(token) - log p_other(token), for tokens sampled from the policy:

    k1          log r                          unbiased, high variance, may be negative
    k2          (log r)^2 / 2                  biased, low variance
    k3          exp(-log r) - 1 + log r        unbiased, low variance, never negative
    low_var_kl  k3 of log r made finite and clamped to [-20, 20] before exp, then clamped to
                [-10, 10]                      as Miles: bounds the rare huge ratio

low_var_kl stays finite for any input: a NaN log-ratio (both log-probs -inf: the token is
impossible under both) counts as 0, +-inf as +-20. Used for the KL loss (`--use-kl-loss`,
policy vs reference, with gradients), for the reward penalty of reinforce_plus_plus
(`--kl-coef`, old policy vs reference) and for the train/rollout mismatch metric.
"""

from __future__ import annotations

import torch

LOW_VAR_KL_CLAMP = 10.0
LOG_RATIO_CLAMP = 20.0


def approx_kl(log_probs: torch.Tensor, other_log_probs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL estimate of `kl_type` (see the module docstring), in fp32."""
    log_ratio = log_probs.float() - other_log_probs.float()
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return log_ratio.square() / 2.0
    if kl_type == "k3":
        return torch.exp(-log_ratio) - 1.0 + log_ratio
    if kl_type == "low_var_kl":
        bounded = torch.nan_to_num(log_ratio, nan=0.0, posinf=LOG_RATIO_CLAMP, neginf=-LOG_RATIO_CLAMP)
        bounded = bounded.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl = torch.exp(-bounded) - 1.0 + bounded
        return kl.clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)
    raise ValueError(f"kl_loss_type: unknown {kl_type!r}, expected k1, k2, k3 or low_var_kl")
