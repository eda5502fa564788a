"""Environments of multi-turn rollouts, chosen by --environment through this registry.

    calculator  the built-in calculator tool (calculator.py)
    remote      an Environment gRPC service in its own process (remote.py, --environment-url)
    custom      the user's Environment class (or factory), --custom-generate-function-path module:attr
    verifiers   a `verifiers` taskset run unmodified, --verifiers-taskset module:attr (verifiers_env.py)
    openenv     a Meta-PyTorch OpenEnv environment server (openenv.py, --openenv-url, --openenv-turns)
    agent       the user's agent (--agent-function-path) against the OpenAI-compatible endpoint
                (openai_api/); agent.py, agent_hub.py
    none        single-turn generation (no episode)

ENVIRONMENTS is the one table of them: each kind's builder and the setting it cannot run without
(rollout/config.py takes the names and the check from it). `environment_factory` returns a
callable that builds one Environment per episode; bad settings raise ConfigError at start-up,
naming the setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollway.common.config import ConfigError, load_object
from rollway.rollout.environments.base import Environment, EpisodeStart, ModelTurn, Step

if TYPE_CHECKING:  # the config imports this table: no import back at run time
    from rollway.rollout.config import RolloutConfig

__all__ = [
    "Environment",
    "EpisodeStart",
    "ModelTurn",
    "Step",
    "NO_ENVIRONMENT",
    "ENVIRONMENTS",
    "environment_factory",
]

NO_ENVIRONMENT = "none"
EnvironmentFactory = Callable[[], Environment]


def _calculator(config: RolloutConfig, agents) -> EnvironmentFactory:
    from rollway.rollout.environments.calculator import CalculatorEnvironment

    return lambda: CalculatorEnvironment(config.generate_tool_call_parser)


def _remote(config: RolloutConfig, agents) -> EnvironmentFactory:
    from rollway.rollout.environments.remote import RemoteEnvironments

    return RemoteEnvironments(config.environment_url, config.environment_step_timeout).new_episode


def _custom(config: RolloutConfig, agents) -> EnvironmentFactory:
    return load_object(
        config.custom_generate_function_path, "custom_generate_function_path", callable_only=True
    )


def _verifiers(config: RolloutConfig, agents) -> EnvironmentFactory:
    from rollway.rollout.environments.verifiers_env import VerifiersEnvironments

    return VerifiersEnvironments(
        config.verifiers_taskset, config.generate_tool_call_parser, config.environment_step_timeout
    ).new_episode


def _openenv(config: RolloutConfig, agents) -> EnvironmentFactory:
    from rollway.rollout.environments.openenv import OpenEnvEpisodes, load_turns

    turns = load_turns(config.openenv_turns)
    return OpenEnvEpisodes(config.openenv_url, config.environment_step_timeout, turns).new_episode


def _agent(config: RolloutConfig, agents) -> EnvironmentFactory:
    if agents is None:
        raise ConfigError("environment", "the 'agent' environment runs only inside the rollout service")
    return agents.environment_factory()


@dataclass(frozen=True)
class EnvironmentKind:
    """How an environment is built (None: single turn) and the setting it cannot run without."""

    build: Callable[[RolloutConfig, Any], EnvironmentFactory] | None
    setting: str = ""
    holds: str = ""  # what that setting holds, for the error that names it


ENVIRONMENTS: dict[str, EnvironmentKind] = {
    NO_ENVIRONMENT: EnvironmentKind(None),
    "calculator": EnvironmentKind(_calculator),
    "remote": EnvironmentKind(_remote, "environment_url", "--environment-url host:port"),
    "custom": EnvironmentKind(_custom, "custom_generate_function_path", "module:attr of an Environment"),
    "verifiers": EnvironmentKind(_verifiers, "verifiers_taskset", "module:attr of a Taskset"),
    "openenv": EnvironmentKind(_openenv, "openenv_url", "--openenv-url http://host:port"),
    "agent": EnvironmentKind(_agent, "agent_function_path", "module:attr of an agent"),
}


def check_environment_settings(name: str, config: RolloutConfig) -> None:
    """ConfigError naming the setting environment `name` needs and `config` lacks."""
    kind = ENVIRONMENTS.get(name)
    if kind is None:
        raise ConfigError("environment", f"unknown environment {name!r}")
    if kind.setting and not getattr(config, kind.setting):
        raise ConfigError(kind.setting, f"the {name!r} environment needs {kind.holds}")


def environment_factory(name: str, config: RolloutConfig, agents=None) -> EnvironmentFactory | None:
    """What builds one environment per episode for `name` (None: single turn); `agents`: the run's
    AgentHub (agent_hub.py), which the 'agent' environment needs."""
    check_environment_settings(name, config)
    build = ENVIRONMENTS[name].build
    return None if build is None else build(config, agents)
