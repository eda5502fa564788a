"""Group-level reward normalisation (the coordinator's half of every advantage estimator).

An estimator has two halves, each computed once, where its inputs are:

  estimator                     coordinator (here: has whole groups)     trainer (returns.py: has the KL)
  grpo, gspo                    (r - mean_g) / (std_g + 1e-6)            broadcast to every response token
  dr_grpo                       r - mean_g                               broadcast; pg loss summed per sample
                                                                         over a constant length (policy_loss)
  rloo                          r - mean of the other samples of g       broadcast
  reinforce_plus_plus           r (raw)                                  -kl_coef*kl per token, r at the last
                                                                         token, gamma-discounted returns
  reinforce_plus_plus_baseline  r - mean_g                               (r - mean_g) - kl_coef*kl per token
  then, for every estimator, with --normalize-advantages, the trainer whitens the token values over
  the whole global batch (all ranks).

As Miles (rollout-side reward post-processing): std_g is the sample standard deviation (n - 1,
torch's default); --disable-grpo-std-normalization drops the division (grpo, gspo);
--disable-rewards-normalization sends the raw rewards (every group estimator); a group of one
has no spread, so n_samples_per_prompt == 1 never divides by a std. The trainer's estimator is
the run's (run_start.disagreements refuses a trainer set otherwise). numpy-only, so the
coordinator stays free of torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EPS = 1e-6
ESTIMATORS = ("grpo", "gspo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
# Estimators whose token-level part (KL reward shaping, returns) the trainer computes.
TRAINER_COMPLETED = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")


def _groups(rewards: Sequence[float], group_size: int) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if group_size <= 0:
        raise ValueError(f"group_size must be positive (got {group_size})")
    if r.size % group_size:
        raise ValueError(f"{r.size} rewards do not split into groups of {group_size}")
    return r.reshape(-1, group_size)


def group_normalised(rewards: Sequence[float], group_size: int, *, use_std: bool = True) -> np.ndarray:
    """GRPO: (r - group mean) / (group sample std + 1e-6); without std with use_std=False or n == 1."""
    g = _groups(rewards, group_size)
    centred = g - g.mean(axis=1, keepdims=True)
    if use_std and group_size > 1:
        centred = centred / (g.std(axis=1, ddof=1, keepdims=True) + EPS)
    return centred.reshape(-1)


def leave_one_out(rewards: Sequence[float], group_size: int) -> np.ndarray:
    """RLOO: r_i - mean of the other samples of the group (0 for groups of one)."""
    g = _groups(rewards, group_size)
    if group_size == 1:
        return np.zeros(g.size)
    others_mean = (g.sum(axis=1, keepdims=True) - g) / (group_size - 1)
    return (g - others_mean).reshape(-1)


def sequence_advantages(
    estimator: str,
    rewards: Sequence[float],
    group_size: int,
    *,
    disable_grpo_std_normalization: bool = False,
    disable_rewards_normalization: bool = False,
) -> np.ndarray:
    """One scalar per sample, in sample order (groups contiguous), for `estimator`."""
    if estimator not in ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {estimator!r}; expected one of {', '.join(ESTIMATORS)}"
        )
    _groups(rewards, group_size)
    if estimator == "reinforce_plus_plus" or disable_rewards_normalization:
        return np.asarray(rewards, dtype=np.float64)
    if estimator in ("grpo", "gspo"):
        return group_normalised(rewards, group_size, use_std=not disable_grpo_std_normalization)
    if estimator == "rloo":
        return leave_one_out(rewards, group_size)
    return group_normalised(rewards, group_size, use_std=False)  # dr_grpo, reinforce_plus_plus_baseline


def zero_std_groups(rewards: Sequence[float], group_size: int) -> np.ndarray:
    """Mask of groups whose rewards are all equal (no learning signal; dropped by dynamic sampling)."""
    g = _groups(rewards, group_size)
    return g.std(axis=1) == 0
