"""KL estimators between the policy and another model, per token (Miles' compute_approx_kl).

With log r = log p_policy(token) - log p_other(token), for tokens sampled from the policy:

    k1          log r                          unbiased, high variance, may be negative
    k2          (log r)^2 / 2                  biased, low variance
    k3          exp(-log r) - 1 + log r        unbiased, low variance, never negative
    low_var_kl  k3 clamped to [-10, 10]        as Miles: bounds the rare huge ratio

Used for the KL loss (`--use-kl-loss`, policy vs reference, with gradients), for the reward
penalty of reinforce_plus_plus (`--kl-coef`, old policy vs reference) and for the train/rollout
mismatch metric.
"""

from __future__ import annotations

import torch

LOW_VAR_KL_CLAMP = 10.0


def approx_kl(log_probs: torch.Tensor, other_log_probs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL estimate of `kl_type` (see the module docstring), in fp32."""
    log_ratio = log_probs.float() - other_log_probs.float()
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return log_ratio.square() / 2.0
    if kl_type in ("k3", "low_var_kl"):
        kl = torch.exp(-log_ratio) - 1.0 + log_ratio
        if kl_type == "low_var_kl":
            kl = kl.clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)
        return kl
    raise ValueError(f"kl_loss_type: unknown {kl_type!r}, expected k1, k2, k3 or low_var_kl")
