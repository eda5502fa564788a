"""Environments of multi-turn rollouts, chosen by --environment through this registry.

    calculator  the built-in calculator tool (calculator.py)
    remote      an Environment gRPC service in its own process (remote.py, --environment-url)
    custom      the user's Environment class (or factory), --custom-generate-function-path module:attr
    verifiers   a `verifiers` taskset run unmodified, --verifiers-taskset module:attr (verifiers_env.py)
    openenv     a Meta-PyTorch OpenEnv environment server (openenv.py, --openenv-url, --openenv-turns)
    agent       the user's agent (--agent-function-path) against the OpenAI-compatible endpoint (agents/)
    none        single-turn generation (no episode)

`environment_factory` returns a callable that builds one Environment per episode; bad settings
raise ConfigError at start-up, naming the setting.
"""

from __future__ import annotations

from collections.abc import Callable

from rollway.common.config import ConfigError, load_object
from rollway.rollout.config import RolloutConfig
from rollway.rollout.environments.base import Environment, EpisodeStart, ModelTurn, Step

__all__ = ["Environment", "EpisodeStart", "ModelTurn", "Step", "NO_ENVIRONMENT", "environment_factory"]

NO_ENVIRONMENT = "none"
EnvironmentFactory = Callable[[], Environment]


def _custom(path: str) -> EnvironmentFactory:
    return load_object(path, "custom_generate_function_path", callable_only=True)


def environment_factory(name: str, config: RolloutConfig, agents=None) -> EnvironmentFactory | None:
    """What builds one environment per episode for `name` (None: single turn); `agents`: the run's
    AgentHub (agents/hub.py), which the 'agent' environment needs."""
    if name == NO_ENVIRONMENT:
        return None
    if name == "calculator":
        from rollway.rollout.environments.calculator import CalculatorEnvironment

        return lambda: CalculatorEnvironment(config.generate_tool_call_parser)
    if name == "remote":
        if not config.environment_url:
            raise ConfigError("environment_url", "the 'remote' environment needs --environment-url host:port")
        from rollway.rollout.environments.remote import RemoteEnvironments

        return RemoteEnvironments(config.environment_url, config.environment_step_timeout).new_episode
    if name == "custom":
        if not config.custom_generate_function_path:
            raise ConfigError(
                "custom_generate_function_path",
                "the 'custom' environment needs module:attr of an Environment",
            )
        return _custom(config.custom_generate_function_path)
    if name == "verifiers":
        if not config.verifiers_taskset:
            raise ConfigError(
                "verifiers_taskset", "the 'verifiers' environment needs module:attr of a Taskset"
            )
        from rollway.rollout.environments.verifiers_env import VerifiersEnvironments

        return VerifiersEnvironments(
            config.verifiers_taskset, config.generate_tool_call_parser, config.environment_step_timeout
        ).new_episode
    if name == "openenv":
        if not config.openenv_url:
            raise ConfigError("openenv_url", "the 'openenv' environment needs --openenv-url http://host:port")
        from rollway.rollout.environments.openenv import OpenEnvEpisodes, load_turns

        turns = load_turns(config.openenv_turns)
        return OpenEnvEpisodes(config.openenv_url, config.environment_step_timeout, turns).new_episode
    if name == "agent":
        if not config.agent_function_path:
            raise ConfigError("agent_function_path", "the 'agent' environment needs module:attr of an agent")
        if agents is None:
            raise ConfigError("environment", "the 'agent' environment runs only inside the rollout service")
        return agents.environment_factory()
    raise ConfigError("environment", f"unknown environment {name!r}")
