"""The per-token losses of the ForwardBackward RPC (the Tinker API's built-in losses).

Each returns the loss term of every target position; the loss is their plain sum (no mean:
the caller weights tokens through `weights` or `advantages`, as the Tinker documentation says).
With ratio = exp(logp - sampling_logp) and A the advantage:

    cross_entropy        -weights * logp
    importance_sampling  -ratio * A
    ppo                  -min(ratio * A, clip(ratio, low, high) * A)
    cispo                -stopgrad(clip(ratio, low, high)) * logp * A

ppo is `--loss-type policy_loss`'s clipped objective (policy_loss.clipped_policy_loss) with
eps_clip = 1 - low and eps_clip_high = high - 1: one PPO clip in the trainer. That includes its
clamp of the log-ratio to +-20, which the Tinker formula does not write: it changes nothing below
a ratio of e^20 and keeps a stale token's exp() from overflowing into an infinite gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rollway.trainer.loss.policy_loss import clipped_policy_loss

DEFAULT_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


@dataclass(frozen=True)
class DatumLoss:
    """A loss: its per-token formula, the per-token inputs it reads, the settings it accepts."""

    fn: Callable[[torch.Tensor, dict[str, torch.Tensor], dict[str, float]], torch.Tensor]
    inputs: tuple[str, ...]
    settings: tuple[str, ...] = ()


def _ratio(logp: torch.Tensor, extras: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.exp(logp - extras["sampling_log_probs"])


def _clip_range(config: dict[str, float]) -> tuple[float, float]:
    low = config.get("clip_low_threshold", DEFAULT_CLIP["clip_low_threshold"])
    high = config.get("clip_high_threshold", DEFAULT_CLIP["clip_high_threshold"])
    return low, high


def _clipped(ratio: torch.Tensor, config: dict[str, float]) -> torch.Tensor:
    return ratio.clamp(*_clip_range(config))


def cross_entropy(logp, extras, config):
    return -extras["weights"] * logp


def importance_sampling(logp, extras, config):
    return -_ratio(logp, extras) * extras["advantages"]


def ppo(logp, extras, config):
    low, high = _clip_range(config)
    log_ratio = logp - extras["sampling_log_probs"]
    loss, _ = clipped_policy_loss(
        log_ratio, extras["advantages"], eps_clip=1.0 - low, eps_clip_high=high - 1.0
    )
    return loss


def cispo(logp, extras, config):
    return -_clipped(_ratio(logp, extras), config).detach() * logp * extras["advantages"]


RL_INPUTS = ("sampling_log_probs", "advantages")
CLIP_SETTINGS = tuple(DEFAULT_CLIP)
DATUM_LOSSES = {
    "cross_entropy": DatumLoss(cross_entropy, ("weights",)),
    "importance_sampling": DatumLoss(importance_sampling, RL_INPUTS),
    "ppo": DatumLoss(ppo, RL_INPUTS, CLIP_SETTINGS),
    "cispo": DatumLoss(cispo, RL_INPUTS, CLIP_SETTINGS),
}
