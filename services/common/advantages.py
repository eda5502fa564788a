"""Group-level reward normalisation and advantage baselines (the coordinator's half of the estimators).

Where each estimator is computed:

  estimator                       here (coordinator: has whole groups)      trainer (has log-probs, KL)
  grpo                            (r - mean_g) / (std_g + 1e-6)             broadcast to every response token
  grpo + disable_grpo_std_norm.   r - mean_g  (Dr.GRPO)                     broadcast
  gspo                            as grpo                                   sequence-level ratio in the loss
  rloo                            r - mean of the other samples in group    broadcast
  reinforce_plus_plus             r (raw)                                   -kl_coef*kl per token, r at last token,
                                                                            discounted returns, whitened
  reinforce_plus_plus_baseline    r - mean_g                                -kl_coef*kl per token, whitened

With n_samples_per_prompt == 1 the std is not used (a group of one has no spread). The
population std (ddof=0) matches Miles. This module is numpy-only so the coordinator stays
free of torch; each formula lives here once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EPS = 1e-6
ESTIMATORS = ("grpo", "gspo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
# Estimators whose token-level part (KL shaping, returns, whitening) the trainer completes.
TRAINER_COMPLETED = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")


def _groups(rewards: Sequence[float], group_size: int) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if group_size <= 0:
        raise ValueError(f"group_size must be positive (got {group_size})")
    if r.size % group_size:
        raise ValueError(f"{r.size} rewards do not split into groups of {group_size}")
    return r.reshape(-1, group_size)


def group_normalised(rewards: Sequence[float], group_size: int, *, use_std: bool = True) -> np.ndarray:
    """GRPO: (r - group mean) / (group std + 1e-6); Dr.GRPO with use_std=False; no std when n == 1."""
    g = _groups(rewards, group_size)
    centred = g - g.mean(axis=1, keepdims=True)
    if use_std and group_size > 1:
        centred = centred / (g.std(axis=1, keepdims=True) + EPS)
    return centred.reshape(-1)


def leave_one_out(rewards: Sequence[float], group_size: int) -> np.ndarray:
    """RLOO: r_i - mean of the other samples of the group (0 for groups of one)."""
    g = _groups(rewards, group_size)
    if group_size == 1:
        return np.zeros(g.size)
    others_mean = (g.sum(axis=1, keepdims=True) - g) / (group_size - 1)
    return (g - others_mean).reshape(-1)


def sequence_advantages(
    estimator: str, rewards: Sequence[float], group_size: int, *, disable_grpo_std_normalization: bool = False
) -> np.ndarray:
    """One scalar per sample, in sample order (groups contiguous), for `estimator`."""
    if estimator in ("grpo", "gspo"):
        return group_normalised(rewards, group_size, use_std=not disable_grpo_std_normalization)
    if estimator == "rloo":
        return leave_one_out(rewards, group_size)
    if estimator == "reinforce_plus_plus":
        return np.asarray(rewards, dtype=np.float64)
    if estimator == "reinforce_plus_plus_baseline":
        return group_normalised(rewards, group_size, use_std=False)
    raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {', '.join(ESTIMATORS)}")


def zero_std_groups(rewards: Sequence[float], group_size: int) -> np.ndarray:
    """Mask of groups whose rewards are all equal (no learning signal; dropped by dynamic sampling)."""
    g = _groups(rewards, group_size)
    return g.std(axis=1) == 0
