"""The Environment gRPC service: Python environments served to rollout services by their own
process (`python -m rollway.environment --environment calculator`).

Health, reflection, auth/TLS, drain on SIGTERM and the parent watch come from the shared server
(rollway.common.server), so it is started and supervised like the other services. Episodes are
Environment instances by episode id; a failing environment is an error status for that call
(the rollout service then marks the sample FAILED), never a dead service.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc

from rollway.common.config import ConfigError, setting
from rollway.common.errors import InvalidArgument, ResourceExhausted
from rollway.common.log import get_logger
from rollway.common.server import RollwayServer, ServerConfig
from rollway.common.structs import from_struct
from rollway.rollout.config import TOOL_CALL_PARSERS, RolloutConfig
from rollway.rollout.environments import environment_factory
from rollway.rollout.environments.base import Environment, EpisodeStart, ModelTurn
from rollway.rollout.v1 import environment_pb2, environment_pb2_grpc, rollout_pb2

log = get_logger("rollway.environment")


@dataclass
class EnvironmentServiceConfig:
    """Settings of the Environment service."""

    environment: str = setting(
        "calculator", "environment served: calculator or custom", choices=("calculator", "custom")
    )
    custom_generate_function_path: str = setting(
        "", "module:attr of the Environment class (or factory) served (--environment custom)"
    )
    generate_tool_call_parser: str = setting(
        "qwen3", "format of tool calls in the model's turns", choices=TOOL_CALL_PARSERS
    )
    max_open_episodes: int = setting(4096, "episodes open at once; one more Reset is RESOURCE_EXHAUSTED")

    def validate(self) -> None:
        if self.max_open_episodes <= 0:
            raise ConfigError("max_open_episodes", f"must be positive (got {self.max_open_episodes})")


class EnvironmentService(environment_pb2_grpc.EnvironmentServiceServicer):
    def __init__(self, config: EnvironmentServiceConfig):
        self.config = config
        self.new_environment = environment_factory(
            config.environment,
            RolloutConfig(
                custom_generate_function_path=config.custom_generate_function_path,
                generate_tool_call_parser=config.generate_tool_call_parser,
            ),
        )
        self._episodes: dict[str, Environment] = {}
        self._lock = threading.Lock()

    def _episode(self, episode_id: str, context) -> Environment:
        with self._lock:
            env = self._episodes.get(episode_id)
        if env is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"episode_id: no open episode {episode_id!r}")
        return env

    def Reset(self, request, context):
        if not request.episode_id:
            raise InvalidArgument("episode_id", "is required")
        env = self.new_environment()
        with self._lock:
            if (
                request.episode_id not in self._episodes
                and len(self._episodes) >= self.config.max_open_episodes
            ):
                raise ResourceExhausted(f"{len(self._episodes)} episodes open (--max-open-episodes)")
            self._episodes[request.episode_id] = env
        metadata = from_struct(request.metadata)
        try:
            env.reset(EpisodeStart(request.prompt, request.label, metadata, tuple(request.prompt_token_ids)))
        except Exception as exc:
            context.abort(grpc.StatusCode.INTERNAL, f"reset failed: {type(exc).__name__}: {exc}")
        return environment_pb2.ResetResponse()

    def Step(self, request, context):
        env = self._episode(request.episode_id, context)
        try:
            step = env.step(
                ModelTurn(request.text, tuple(request.token_ids), request.finish_reason or "stop")
            )
        except Exception as exc:
            context.abort(grpc.StatusCode.INTERNAL, f"step failed: {type(exc).__name__}: {exc}")
        return environment_pb2.StepResponse(
            observation=step.observation,
            messages=[rollout_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in step.messages],
            reward=step.reward,
            done=step.done,
            metrics=step.metrics,
        )

    def Close(self, request, context):
        with self._lock:
            env = self._episodes.pop(request.episode_id, None)
        if env is not None:
            try:
                env.close()
            except Exception as exc:
                log.warning("environment close failed", error=f"{type(exc).__name__}: {exc}")
        return environment_pb2.CloseResponse()


def serve(server_config: ServerConfig, config: EnvironmentServiceConfig) -> None:
    """Serve until SIGTERM."""
    server = RollwayServer("environment", server_config)
    descriptor = environment_pb2.DESCRIPTOR.services_by_name["EnvironmentService"]
    server.add_service(
        environment_pb2_grpc.add_EnvironmentServiceServicer_to_server, EnvironmentService(config), descriptor
    )
    server.start()
    server.set_serving()
    server.wait_for_termination()
