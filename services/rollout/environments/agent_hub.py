"""The agents of a run: their episodes by id, the HTTP endpoint they talk to, and where they run.

The endpoint (http_api.py) starts with the first agent episode, on the service's host (loopback
unless the service was told otherwise) and --openai-api-port, and stops with the run. Each
sample's agent gets base_url http://HOST:PORT/episodes/<episode id>/v1, so concurrent agents'
requests reach their own episodes. A sync agent runs in a thread of its own; an async one
(async def) on one event loop shared by the run's agents.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable

from rollway.common.config import load_object
from rollway.common.log import get_logger
from rollway.rollout.config import RolloutConfig
from rollway.rollout.environments.agent import AgentEnded, AgentEpisode, AgentTask
from rollway.rollout.environments.base import EpisodeStart
from rollway.rollout.prompt_encoding import PromptEncoder
from rollway.rollout.rewards.types import RewardFunction

log = get_logger("rollway.rollout.agents")
NO_API_KEY = "rollway"  # the openai client insists on a key; the service without --auth-token takes any


def load_agent(path: str) -> Callable:
    """The user's agent function (module:attr); ConfigError naming agent_function_path if unusable."""
    return load_object(path, "agent_function_path", callable_only=True)


class AgentHub:
    """Episodes by id, the HTTP endpoint, and the agents' threads and event loop."""

    def __init__(
        self,
        config: RolloutConfig,
        encoder: PromptEncoder,
        host: str,
        auth_token: str,
        decode,
        rewards: dict[str, RewardFunction] | None = None,
    ):
        self.config = config
        self.rewards = rewards or {}
        # Plain /v1 requests: a Generate call in process (GenerateRequest -> samples); the service sets it.
        self.generate: Callable | None = None
        self.encoder = encoder
        self.host = host
        self.auth_token = auth_token
        self.model_name = config.hf_checkpoint
        self.decode = decode
        self._episodes: dict[str, AgentEpisode] = {}
        self._lock = threading.Lock()
        self._server = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._agent: Callable | None = None
        self._closed = False

    def decode_token(self, token_id: int) -> str:
        return self.decode((token_id,))

    def scorer(self) -> RewardFunction | None:
        """The run's reward function for episodes whose agent gives no reward (a group reward
        cannot score one episode alone: then none)."""
        reward = self.rewards.get(self.config.reward)
        return None if reward is None or reward.group else reward

    def environment_factory(self) -> Callable[[], AgentEpisode]:
        """What builds one episode per sample; the agent is imported now, so a bad path fails now."""
        self._agent = load_agent(self.config.agent_function_path)
        return lambda: AgentEpisode(self)

    # --- episodes ---

    def register(self, episode: AgentEpisode) -> None:
        self._ensure_server()
        with self._lock:
            self._episodes[episode.episode_id] = episode

    def unregister(self, episode: AgentEpisode) -> None:
        with self._lock:
            self._episodes.pop(episode.episode_id, None)

    def find(self, episode_id: str) -> AgentEpisode | None:
        with self._lock:
            return self._episodes.get(episode_id)

    def base_url(self, episode_id: str) -> str:
        return f"{self._server.url}/episodes/{episode_id}/v1"

    # --- agents ---

    def launch(self, episode: AgentEpisode, start: EpisodeStart) -> None:
        """Run the agent for `episode`; its end (return value or exception) is the episode's event."""
        agent = self._agent
        task = AgentTask(
            start.prompt, start.label, dict(start.metadata), episode.episode_id, self.auth_token or NO_API_KEY
        )
        base_url = self.base_url(episode.episode_id)

        def ended(result=None, error: BaseException | None = None) -> None:
            if error is not None:
                log.warning(
                    "agent raised", episode_id=episode.episode_id, error=f"{type(error).__name__}: {error}"
                )
            episode.events.put(AgentEnded(result, f"{type(error).__name__}: {error}" if error else ""))

        if inspect.iscoroutinefunction(agent):
            future = asyncio.run_coroutine_threadsafe(agent(base_url, task), self._event_loop())
            future.add_done_callback(
                lambda f: ended(error=f.exception()) if f.exception() else ended(f.result())
            )
            return

        def run() -> None:
            try:
                result = agent(base_url, task)
            except BaseException as exc:  # the user's code: any failure ends its episode, reported
                ended(error=exc)
                return
            ended(result)

        threading.Thread(target=run, name=f"agent-{episode.episode_id[:8]}", daemon=True).start()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="agents", daemon=True).start()
            return self._loop

    # --- the endpoint ---

    def start(self) -> None:
        """Serve now (plain /v1 requests), not only from the first agent episode on."""
        self._ensure_server()

    def _ensure_server(self) -> None:
        with self._lock:
            if self._server is not None:
                return
            if self._closed:
                raise RuntimeError("the run's agents are closed")
            from rollway.rollout.openai_api.http_api import OpenAIServer, create_app

            self._server = OpenAIServer(create_app(self), self.host, self.config.openai_api_port).start()
            log.info("OpenAI-compatible endpoint serving agent episodes", url=self._server.url)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            server, loop = self._server, self._loop
        if server is not None:
            server.stop()
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
