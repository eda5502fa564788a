"""Reward functions, chosen by --reward or GenerateRequest.reward through this explicit registry.

Built in: exact_match, math, f1. Registered when configured: remote (--rm-url) and custom
(--custom-rm-path module:function; a group reward with --group-rm). "none" gives no reward.
"""

from __future__ import annotations

from rollway.common.config import ConfigError
from rollway.common.shared_settings import BUILTIN_REWARD_NAMES
from rollway.rollout.config import RolloutConfig
from rollway.rollout.rewards.custom import load_custom_reward
from rollway.rollout.rewards.math_reward import math_reward
from rollway.rollout.rewards.remote import remote_reward
from rollway.rollout.rewards.runner import RewardRunner
from rollway.rollout.rewards.text_match import exact_match, f1
from rollway.rollout.rewards.types import RewardFunction, RewardSample

NO_REWARD = "none"
BUILTIN_REWARDS = {
    "exact_match": RewardFunction("exact_match", exact_match),
    "math": RewardFunction("math", math_reward),
    "f1": RewardFunction("f1", f1),
}

assert set(BUILTIN_REWARDS) == set(BUILTIN_REWARD_NAMES)  # the names the run config checks

__all__ = ["NO_REWARD", "RewardFunction", "RewardRunner", "RewardSample", "build_rewards"]


def build_rewards(config: RolloutConfig) -> dict[str, RewardFunction]:
    """The registry for this service; ConfigError if --reward names one that is not registered."""
    rewards = dict(BUILTIN_REWARDS)
    if config.rm_url:
        rewards["remote"] = RewardFunction("remote", remote_reward(config.rm_url, config.reward_timeout))
    if config.custom_rm_path:
        rewards["custom"] = load_custom_reward(config.custom_rm_path, config.group_rm, config)
    if config.reward != NO_REWARD and config.reward not in rewards:
        raise ConfigError(
            "reward", f"unknown reward {config.reward!r}; registered: {', '.join(sorted(rewards))}, none"
        )
    return rewards
