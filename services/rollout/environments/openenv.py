"""The client side of --environment openenv: episodes run by a Meta-PyTorch OpenEnv server.

    rollout episode ──reset──> OpenEnvEpisode ──WebSocket /ws (EnvClient, unmodified)──> OpenEnv app
                    ──step───>   turns.action(turn) -> Action;  StepResult -> turns.step() -> Step

OpenEnv's HTTP /reset and /step build a fresh environment for every request (no episode state),
so each episode opens its own WebSocket session: the server gives every session its own
environment instance (the app's max_concurrent_envs bounds how many at once). The episode's
client is the user's EnvClient subclass (OpenEnvTurns.client_class; default GenericEnvClient,
observations as dicts), driven on one event loop shared by the pool's episodes.

Every call has --environment-step-timeout as its deadline. Any failure (the server died or
refused, a deadline passed, its answer is not understood) raises EnvironmentFailed, so the sample
ends FINISH_REASON_FAILED, never hangs. A reset waits (within that deadline) for a server that
is not reachable yet: one being restarted on the same port by the coordinator takes new
episodes once it is back; a step in flight when the server dies fails at once.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from rollway.rollout.environments.base import Environment, EnvironmentFailed, EpisodeStart, ModelTurn, Step

RECONNECT_SECONDS = 0.2  # between connection attempts of a reset while the server is not up


class OpenEnvTurns:
    """How a rollway episode meets an OpenEnv environment; subclass it and override what differs.

    The default fits a text environment whose Action has a `message: str` field and whose
    Observation has a `message: str` field (appended verbatim after the model's turn)."""

    def client_class(self) -> type:
        """The EnvClient subclass of the environment (its typed Action/Observation parsing)."""
        from openenv.core.generic_client import GenericEnvClient

        return GenericEnvClient

    def reset_kwargs(self, start: EpisodeStart) -> dict[str, Any]:
        """Keyword arguments of the environment's reset; OpenEnv passes only those its reset
        accepts, so an environment that takes no `label` is not refused for it."""
        return {"prompt": start.prompt, "label": start.label, "metadata": dict(start.metadata)}

    def action(self, turn: ModelTurn) -> Any:
        """The Action the model's turn is (a typed Action, or a dict for GenericEnvClient)."""
        return {"message": turn.text}

    def step(self, result: Any) -> Step:
        """The Step a StepResult is: its observation's text (or chat messages), reward and done."""
        observation = result.observation
        text = (
            observation.get("message")
            if isinstance(observation, dict)
            else getattr(observation, "message", None)
        )
        if not isinstance(text, str):
            raise TypeError(
                "the observation has no 'message' text: give --openenv-turns module:attr "
                f"(an OpenEnvTurns) that renders it (got {observation!r})"
            )
        return Step(observation=text, reward=float(result.reward or 0.0), done=bool(result.done))


def load_turns(path: str) -> OpenEnvTurns:
    """The OpenEnvTurns named by --openenv-turns module:attr (a class, factory or instance)."""
    if not path:
        return OpenEnvTurns()
    from rollway.common.config import ConfigError, load_object

    found = load_object(path, "openenv_turns")
    turns = found() if isinstance(found, type) or not hasattr(found, "action") else found
    if not all(callable(getattr(turns, name, None)) for name in ("action", "step", "reset_kwargs")):
        raise ConfigError("openenv_turns", f"{path!r} is not an OpenEnvTurns (action, step, reset_kwargs)")
    return turns


class OpenEnvEpisodes:
    """The server's address, the turns and one event loop; `new_episode` is the per-episode factory."""

    def __init__(self, url: str, timeout_seconds: float, turns: OpenEnvTurns):
        self.url = url if "://" in url else f"http://{url}"
        self.timeout_seconds = timeout_seconds
        self.turns = turns
        self.client_class = turns.client_class()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="openenv-client", daemon=True).start()

    def new_episode(self) -> OpenEnvEpisode:
        return OpenEnvEpisode(self)

    def run(self, coroutine, what: str):
        """`coroutine` on the pool's loop, within the deadline; EnvironmentFailed on any failure."""
        future = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(coroutine, self.timeout_seconds), self.loop
        )
        try:
            return future.result(self.timeout_seconds + 5.0)  # wait_for ends it first; never hangs
        except TimeoutError:
            future.cancel()
            raise EnvironmentFailed(
                f"openenv environment {self.url} {what}: no answer within {self.timeout_seconds:g}s "
                "(--environment-step-timeout)"
            ) from None
        except Exception as exc:
            raise EnvironmentFailed(
                f"openenv environment {self.url} {what}: {type(exc).__name__}: {exc}"
            ) from None


class OpenEnvEpisode(Environment):
    """One episode: one WebSocket session of the OpenEnv server (its own environment instance)."""

    def __init__(self, pool: OpenEnvEpisodes):
        self.pool = pool
        timeout = pool.timeout_seconds
        self.client = pool.client_class(
            base_url=pool.url, connect_timeout_s=timeout, message_timeout_s=timeout
        )

    async def _connect(self) -> None:
        # Nothing of the episode has happened yet: waiting for a restarting server is safe.
        while True:
            try:
                await self.client.connect()
                return
            except ConnectionError as exc:
                if not isinstance(exc.__cause__, ConnectionRefusedError):
                    raise
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _reset(self, kwargs: dict[str, Any]) -> None:
        await self._connect()
        await self.client.reset(**kwargs)

    def reset(self, start: EpisodeStart) -> None:
        # The reset's observation is not appended: the episode's prompt comes from the data.
        self.pool.run(self._reset(self.pool.turns.reset_kwargs(start)), "reset")

    def step(self, turn: ModelTurn) -> Step:
        action = self.pool.turns.action(turn)
        result = self.pool.run(self.client.step(action), "step")
        try:
            return self.pool.turns.step(result)
        except Exception as exc:
            raise EnvironmentFailed(
                f"openenv environment {self.pool.url} step: {type(exc).__name__}: {exc}"
            ) from None

    def close(self) -> None:
        try:
            self.pool.run(self.client.close(), "close")  # ends the session: the server frees its env
        except EnvironmentFailed:
            pass  # the episode is over either way; a dead server holds nothing
