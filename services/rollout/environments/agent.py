"""One agent episode: the Environment whose observations are the agent's HTTP requests.

    EpisodeEngine ──reset──> launch agent(base_url, task) ──> wait for its first request
                                                              (rendered: the sample's prompt)
    model turn (token-in, token-out) ──step(turn)──> answer the waiting request with the turn
                                                 ──> wait for the next request: what it adds
                                                     (new messages, rendered) is the observation
    agent returns ──────────────────────────────────> Step(done, reward)

The episode is never re-tokenised: a later request must repeat the recorded history and only add
to it (tool results, user turns); one that rewrites it is refused (HTTP 400, naming the first
message that differs) and the episode waits for a request that extends it. A model turn is
answered with its token ids, log-probs and weight version under the response's `rollway` key.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollway.rollout.environments.base import Environment, EnvironmentFailed, EpisodeStart, ModelTurn, Step
from rollway.rollout.openai_api.chat_format import (
    BadRequest,
    assistant_reply,
    normalise_messages,
    same_turn,
    template_messages,
)
from rollway.rollout.rewards.types import RewardSample

if TYPE_CHECKING:
    from concurrent.futures import Future

    from rollway.rollout.environments.agent_hub import AgentHub

CHAT, COMPLETION = "chat.completion", "text_completion"


class HttpError(Exception):
    """An answer to an agent's request other than a model turn: status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class AgentRequest:
    """One HTTP request of the agent, answered through `reply` (a dict, or an HttpError)."""

    kind: str  # CHAT or COMPLETION
    body: dict
    reply: Future


@dataclass(frozen=True)
class AgentTask:
    """What the agent is given besides its base_url."""

    prompt: str  # the sample's prompt, decoded from its token ids
    label: str
    metadata: dict[str, Any]
    episode_id: str
    api_key: str  # the service's auth token (a placeholder when it has none)


@dataclass(frozen=True)
class AgentEnded:
    """The agent function returned (result) or raised (error)."""

    result: Any = None
    error: str = ""


INTERRUPTED = "interrupted"  # an event: the episode was ended from outside (abort, timeout)


@dataclass
class _Record:
    kind: str = ""
    tools: Any = None
    messages: list[dict] = field(default_factory=list)  # chat: the history, last reply included
    text: str = ""  # completions: the prompt and completions so far
    token_ids: list[int] = field(default_factory=list)  # prompt + response so far


class AgentEpisode(Environment):
    """The environment of one sample run by an agent (see the module doc)."""

    def __init__(self, hub: AgentHub):
        self.hub = hub
        self.episode_id = uuid.uuid4().hex
        self.events: queue.Queue[AgentRequest | AgentEnded | str] = queue.Queue()
        self.record = _Record()
        self.prompt_token_ids: tuple[int, ...] = ()
        self.pending: AgentRequest | None = None
        self.posted_reward: float | None = None
        self.num_turns = 0
        self.start: EpisodeStart | None = None
        self.last_turn_text = ""  # what the run's reward function scores when the agent gives no reward
        self._lock = threading.Lock()
        self._closed = False

    # --- from the HTTP side ---

    def submit(self, request: AgentRequest) -> None:
        with self._lock:
            if self._closed:
                raise HttpError(404, f"episode {self.episode_id} is over")
            self.events.put(request)

    def post_reward(self, reward: float) -> None:
        with self._lock:
            if self._closed:
                raise HttpError(404, f"episode {self.episode_id} is over")
            self.posted_reward = reward

    # --- the Environment contract (environment worker threads) ---

    def reset(self, start: EpisodeStart) -> None:
        if start.resumed:
            raise EnvironmentFailed(
                "an agent episode cannot be continued after an abort (the agent's own state is gone); "
                "run agents without --partial-rollout"
            )
        self.start = start
        self.hub.register(self)
        self.hub.launch(self, start)
        ended = self._next_request()
        if ended == INTERRUPTED:
            return  # the episode ends without a prompt of the agent's
        if ended is not None:
            raise EnvironmentFailed(
                f"the agent ended before its first request: {ended.error or f'returned {ended.result!r}'}"
            )

    def episode_prompt_token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids

    def step(self, turn: ModelTurn) -> Step:
        self._answer(turn)
        ended = self._next_request()
        if ended == INTERRUPTED:
            return Step()  # nothing to add: the engine ends the episode (abort or timeout)
        if ended is None:
            return Step(observation=self._observation)
        if ended.error:
            raise EnvironmentFailed(f"the agent raised: {ended.error}")
        return Step(reward=self._reward(ended.result), done=True)

    def interrupt(self) -> None:
        self.events.put(INTERRUPTED)

    def episode_cut(self, turn: ModelTurn) -> None:
        if self.pending is not None:  # the agent gets its turn, finish_reason "length"; the episode is over
            self._answer(turn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.hub.unregister(self)
        gone = HttpError(409, f"episode {self.episode_id} ended (a limit, an abort or a timeout)")
        if self.pending is not None and not self.pending.reply.done():
            self.pending.reply.set_exception(gone)
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, AgentRequest):
                event.reply.set_exception(gone)

    # --- requests ---

    def _next_request(self) -> AgentEnded | str | None:
        """Wait for a request that extends the episode (it becomes `pending`), the agent's end, or
        INTERRUPTED."""
        deadline = time.monotonic() + self.hub.config.agent_request_timeout
        while True:
            try:
                event = self.events.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                raise EnvironmentFailed(
                    f"the agent sent no request for {self.hub.config.agent_request_timeout:g} s "
                    "(--agent-request-timeout)"
                ) from None
            if isinstance(event, AgentEnded) or event == INTERRUPTED:
                return event
            try:
                self._observation = self._accept(event)
            except BadRequest as exc:
                event.reply.set_exception(HttpError(400, str(exc)))
                continue
            self.pending = event
            return None

    def _accept(self, request: AgentRequest) -> str:
        """The text the request adds to the episode (the whole prompt for the first request)."""
        record, encoder = self.record, self.hub.encoder
        first = not record.kind
        if record.kind and request.kind != record.kind:
            raise BadRequest(f"this episode talks {record.kind} requests; got a {request.kind} request")
        try:
            if request.kind == CHAT:
                text = self._accept_chat(request.body)
            else:
                text = self._accept_completion(request.body)
        except ValueError as exc:  # the chat template refused the messages
            raise BadRequest(str(exc)) from None
        ids = encoder.token_ids(text)
        if first:
            if not ids:
                raise BadRequest("the first request renders to no tokens")
            self.prompt_token_ids = ids
        record.kind = request.kind
        record.token_ids += ids
        return "" if first else text  # the first request is the prompt, not an observation

    def _accept_chat(self, body: dict) -> str:
        record = self.record
        messages = normalise_messages(body.get("messages"))
        tools = body.get("tools") or None
        if not record.kind:
            text = self.hub.encoder.render_chat(template_messages(messages), tools)
            record.messages, record.tools = messages, tools
            return text
        known = record.messages
        for i, recorded in enumerate(known):
            if i >= len(messages) or not same_turn(messages[i], recorded):
                raise BadRequest(
                    f"messages[{i}] differs from the episode's recorded history (or is missing): "
                    "a request must repeat the conversation so far and only add to it; "
                    "a new conversation is a new episode"
                )
        new = messages[len(known) :]
        if not new:
            raise BadRequest("the request adds no message to the conversation so far")
        if any(m["role"] == "assistant" for m in new):
            raise BadRequest("only the model writes assistant turns in an episode")
        if tools != record.tools:
            raise BadRequest("tools must stay the same for the whole episode")
        # As environment messages are appended: the model's turn ended on the end-of-turn token.
        text = "\n" + self.hub.encoder.render_chat(template_messages(new))
        record.messages = messages
        return text

    def _accept_completion(self, body: dict) -> str:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt must be one non-empty string")
        record = self.record
        if not record.kind:
            record.text = prompt
            return prompt
        if not prompt.startswith(record.text):
            raise BadRequest(
                "prompt must start with the episode's text so far (its prompt and completions): "
                "it may only add to it"
            )
        added, record.text = prompt[len(record.text) :], prompt
        return added

    def _answer(self, turn: ModelTurn) -> None:
        request, self.pending = self.pending, None
        self.num_turns += 1
        self.last_turn_text = turn.text
        prompt_ids = list(self.record.token_ids)
        self.record.token_ids += turn.token_ids
        recorded = {
            "episode_id": self.episode_id,
            "turn": self.num_turns,
            "prompt_token_ids": prompt_ids,
            "completion_token_ids": list(turn.token_ids),
            "completion_log_probs": list(turn.log_probs),
            "weight_version": turn.weight_version,
        }
        finish = turn.finish_reason if turn.finish_reason in ("stop", "length") else "stop"
        response: dict[str, Any] = {
            "id": f"{'chatcmpl' if request.kind == CHAT else 'cmpl'}-{self.episode_id}-{self.num_turns}",
            "object": request.kind,
            "created": int(time.time()),
            "model": self.hub.model_name,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(turn.token_ids),
                "total_tokens": len(prompt_ids) + len(turn.token_ids),
            },
            "rollway": recorded,
        }
        if request.kind == CHAT:
            reply = assistant_reply(turn.text, finish, self.hub.config.generate_tool_call_parser, "call")
            self.record.messages.append(reply.recorded())
            choice = {"index": 0, "message": reply.message(), "finish_reason": reply.finish_reason}
            if request.body.get("logprobs"):
                choice["logprobs"] = {"content": self._token_log_probs(turn)}
        else:
            self.record.text += turn.text
            choice = {"index": 0, "text": turn.text, "finish_reason": finish}
        response["choices"] = [{**choice, "logprobs": choice.get("logprobs")}]
        request.reply.set_result(response)

    def _token_log_probs(self, turn: ModelTurn) -> list[dict]:
        decode = self.hub.decode_token
        return [
            {"token": decode(t), "logprob": lp, "bytes": list(decode(t).encode()), "top_logprobs": []}
            for t, lp in zip(turn.token_ids, turn.log_probs, strict=True)
        ]

    def _reward(self, result: Any) -> float:
        """The agent's return value when it is a number, else the reward it posted, else the run's
        reward function (--reward) on the last model turn's text, else 0."""
        if isinstance(result, int | float) and not isinstance(result, bool):
            return float(result)
        if self.posted_reward is not None:
            return self.posted_reward
        reward = self.hub.scorer()
        if reward is None:
            return 0.0
        start = self.start
        sample = RewardSample(
            prompt=self.hub.decode(self.prompt_token_ids),
            response=self.last_turn_text,
            label=start.label,
            metadata=dict(start.metadata),
            prompt_token_ids=self.prompt_token_ids,
        )
        try:
            return float(reward.fn(sample))
        except Exception as exc:  # the user's reward code: the sample fails, naming it
            raise EnvironmentFailed(
                f"reward function {reward.name!r} failed: {type(exc).__name__}: {exc}"
            ) from None
