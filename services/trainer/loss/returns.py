"""The trainer's token part of the advantage estimators (the group part: rollway.common.advantages).

The coordinator sends one value per response token in `advantages`: the raw reward r for
reinforce_plus_plus, r - group mean for reinforce_plus_plus_baseline, the finished sequence
advantage for the others. The trainer has the KL, so it finishes them here, per sample, over the
response tokens (as Miles' compute_advantages_and_returns):

    reinforce_plus_plus:           rewards_t = -kl_coef * kl_t * m_t, plus r at the last loss token
                                   returns_t = rewards_t + gamma * returns_{t+1}
    reinforce_plus_plus_baseline:  a_t = (r - mean) - kl_coef * kl_t
    grpo, gspo, dr_grpo, rloo:     a_t = the coordinator's value

and with --normalize-advantages (any estimator; off by default, as Miles) whitens them over
every loss token of the global batch (all samples on all ranks, as Miles'
distributed_masked_whiten): (x - mean) / sqrt(unbiased var + 1e-8).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

WHITEN_EPS = 1e-8


def discounted_returns(token_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """returns_t = sum_{k >= t} gamma^(k - t) * rewards_k (1-D)."""
    if gamma == 1.0:
        return token_rewards.double().flip(0).cumsum(0).flip(0).to(token_rewards.dtype)
    rewards = token_rewards.double().tolist()
    running, returns = 0.0, [0.0] * len(rewards)
    for t in range(len(rewards) - 1, -1, -1):  # plain floats: fast enough for long responses
        running = rewards[t] + gamma * running
        returns[t] = running
    return torch.tensor(returns, dtype=token_rewards.dtype)


def reinforce_plus_plus_returns(
    advantages: torch.Tensor, kl: torch.Tensor, loss_mask: torch.Tensor, kl_coef: float, gamma: float
) -> torch.Tensor:
    """Discounted returns of -kl_coef * kl per token and the reward at the last loss token."""
    token_rewards = -kl_coef * kl * loss_mask
    positions = torch.nonzero(loss_mask)
    if positions.numel():  # a sample without loss tokens trains nothing; its reward has no place
        last = int(positions[-1, 0])
        token_rewards[last] = token_rewards[last] + advantages[last]
    return discounted_returns(token_rewards, gamma)


def reinforce_plus_plus_baseline(advantages: torch.Tensor, kl: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """(r - group mean) - kl_coef * kl, per token."""
    return advantages - kl_coef * kl


def whiten(values: list[torch.Tensor], masks: list[torch.Tensor], distributed: bool) -> list[torch.Tensor]:
    """Whiten `values` with the masked mean and unbiased variance of all of them on every rank.

    Every rank must call it (with `distributed`), even with no values."""
    stats = torch.zeros(3, dtype=torch.float64)
    for v, m in zip(values, masks, strict=True):
        v, m = v.double(), m.double()
        stats += torch.stack([(v * m).sum(), (v * v * m).sum(), m.sum()])
    if distributed:
        dist.all_reduce(stats)
    total, total_sq, count = stats.tolist()
    if count == 0:
        return values
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    if count >= 2:
        var *= count / (count - 1)
    scale = (var + WHITEN_EPS) ** -0.5
    return [((v.double() - mean) * scale).to(v.dtype) for v in values]
