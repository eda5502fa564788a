"""Which environment a Generate call runs its episodes with, and the limits of an episode.

Environment factories are built once per name and run (a remote environment keeps one channel);
an unknown or unusable name in a request is INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import threading

from rollway.common.config import ConfigError
from rollway.common.errors import InvalidArgument
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import ModelInfo
from rollway.rollout.environments import ENVIRONMENTS, NO_ENVIRONMENT, environment_factory
from rollway.rollout.episode_spec import EpisodeLimits


class EnvironmentRegistry:
    """Environment factories by name (built on first use)."""

    def __init__(self, config: RolloutConfig, agents=None):
        self.config = config
        self.agents = agents  # the run's AgentHub (the 'agent' environment)
        self._factories: dict[str, object] = {}
        self._lock = threading.Lock()

    def get(self, name: str):
        """The factory of environment `name` (None: single turn)."""
        if name not in ENVIRONMENTS:
            raise InvalidArgument(
                "environment", f"unknown environment {name!r}; known: {', '.join(ENVIRONMENTS)}"
            )
        if name == NO_ENVIRONMENT:
            return None
        with self._lock:
            if name not in self._factories:
                try:
                    self._factories[name] = environment_factory(name, self.config, self.agents)
                except ConfigError as exc:
                    raise InvalidArgument("environment", f"{name}: {exc.setting}: {exc.problem}") from None
            return self._factories[name]


def episode_limits(config: RolloutConfig, info: ModelInfo) -> EpisodeLimits:
    return EpisodeLimits(
        max_turns=config.generate_max_turns,
        max_total_tokens=config.generate_max_total_tokens,
        max_context_len=info.max_context_len,
        turn_timeout=config.generate_turn_timeout,
        episode_timeout=config.generate_episode_timeout,
    )
