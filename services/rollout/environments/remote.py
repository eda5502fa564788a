"""The client side of --environment remote: episodes run by an Environment gRPC service.

Each episode gets a fresh id; every call carries --environment-step-timeout as its deadline. Any
failure (the process died, a deadline passed, the service refused) raises EnvironmentFailed, so
the sample ends FINISH_REASON_FAILED with the status in reward_error, never hangs. A Reset waits
(within that deadline) for an environment that is not reachable yet: one being restarted by its
supervisor (the coordinator restarts a run's environment on the same port) takes new episodes
once it is back, instead of every episode begun in the meantime failing at once; a call in
flight when the environment dies still fails at once.
"""

from __future__ import annotations

import uuid

import grpc

from rollway.common.client import ClientConfig, open_channel
from rollway.rollout.environments.base import Environment, EnvironmentFailed, EpisodeStart, ModelTurn, Step
from rollway.rollout.v1 import environment_pb2, environment_pb2_grpc


class RemoteEnvironments:
    """One channel to the Environment service; `new_episode` is the per-episode factory."""

    def __init__(self, address: str, timeout_seconds: float):
        self.address = address
        self.timeout_seconds = timeout_seconds
        # No retries: Step is not idempotent, and a dead environment must fail its samples now.
        config = ClientConfig(timeout_seconds=timeout_seconds, max_retries=0, busy_retries=0)
        self.stub = environment_pb2_grpc.EnvironmentServiceStub(open_channel(address, config))

    def new_episode(self) -> RemoteEnvironment:
        return RemoteEnvironment(self, uuid.uuid4().hex)


class RemoteEnvironment(Environment):
    def __init__(self, pool: RemoteEnvironments, episode_id: str):
        self.pool = pool
        self.episode_id = episode_id

    def _call(self, method: str, request, *, wait_for_ready: bool = False):
        try:
            return getattr(self.pool.stub, method)(
                request, timeout=self.pool.timeout_seconds, wait_for_ready=wait_for_ready
            )
        except grpc.RpcError as exc:
            raise EnvironmentFailed(
                f"remote environment {self.pool.address} {method}: {exc.code().name}: {exc.details()}"
            ) from None

    def reset(self, start: EpisodeStart) -> None:
        request = environment_pb2.ResetRequest(
            episode_id=self.episode_id,
            prompt=start.prompt,
            label=start.label,
            prompt_token_ids=start.prompt_token_ids,
        )
        if start.metadata:
            request.metadata.update(start.metadata)
        # Nothing of the episode has happened yet: waiting for the service to be back is safe.
        self._call("Reset", request, wait_for_ready=True)

    def step(self, turn: ModelTurn) -> Step:
        reply = self._call(
            "Step",
            environment_pb2.StepRequest(
                episode_id=self.episode_id,
                text=turn.text,
                token_ids=turn.token_ids,
                finish_reason=turn.finish_reason,
            ),
        )
        return Step(
            observation=reply.observation,
            messages=[{"role": m.role, "content": m.content} for m in reply.messages],
            reward=reply.reward,
            done=reply.done,
            metrics=dict(reply.metrics),
        )

    def close(self) -> None:
        try:
            self.pool.stub.Close(environment_pb2.CloseRequest(episode_id=self.episode_id), timeout=5.0)
        except grpc.RpcError:
            pass  # the episode is over either way; a dead service holds nothing
