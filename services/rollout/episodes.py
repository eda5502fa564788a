"""Multi-turn episodes: a sample is a sequence of model turns and environment turns.

    GenerateStream ─submit─> EpisodeEngine ── reset (worker pool) ──> turn k: engine.submit([prompt + response])
                                  ^                                              │ SampleResult (engine thread)
                                  │ done / limit / abort / failure               v
          on_finish(SampleResult + EpisodeOutcome) <── env.step (worker pool) <──┘
                                                       observation ids appended ──> turn k+1

Token-in, token-out: every turn's prompt is the prompt's token ids followed by the response ids
so far, exactly as sampled or appended; an observation is tokenised on its own and appended, the
episode is never re-tokenised. Model tokens carry loss mask 1 and their rollout log-probs;
environment tokens carry loss mask 0 and log-prob 0.0 (the arrays stay aligned with the response).
Each model turn records the weight version that generated it.

Limits end an episode with their own finish reason: --generate-max-turns (max_turns),
--generate-max-total-tokens or the model context (max_tokens), --generate-turn-timeout
(turn_timeout), --generate-episode-timeout (episode_timeout); an environment that raises ends it
with "failed". A turn cut by --rollout-max-response-len ends it with "length". A watchdog thread
enforces the timeouts (one thread for all episodes, not a timer per episode).

Abort (Pause, Abort, client gone): a turn in flight is aborted in the engine and the episode ends
with the tokens generated so far; an environment step in flight is let finish (its observation is
appended), so an aborted episode always ends mid model turn or right after an environment turn,
and a continuation (partial rollout: Prompt.response_prefix with its loss mask and turns) resets
the environment, replays the finished model turns to rebuild its state, and goes on from there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from rollway.common.log import get_logger
from rollway.rollout.engines.base import (
    FINISH_ABORT,
    FINISH_LENGTH,
    BatchHandle,
    Engine,
    SampleRequest,
    SampleResult,
)
from rollway.rollout.environments.base import Environment, EpisodeStart, ModelTurn, Step
from rollway.rollout.episode_spec import (
    ENVIRONMENT,
    FINISH_EPISODE_TIMEOUT,
    FINISH_FAILED,
    FINISH_MAX_TOKENS,
    FINISH_MAX_TURNS,
    FINISH_TURN_TIMEOUT,
    MODEL,
    EpisodeLimits,
    EpisodeOutcome,
    EpisodeSpec,
    TextCodec,
    TurnRecord,
)

log = get_logger("rollway.rollout.episodes")

SEED_STRIDE = 1_000_003  # turn k of a sample seeded s samples with seed s + k * SEED_STRIDE
WATCHDOG_SECONDS = 0.05


@dataclass(eq=False)
class _Episode:
    request: SampleRequest
    spec: EpisodeSpec
    batch: EpisodeBatch
    deadline: float
    env: Environment | None = None
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    turn_start: int = 0  # where the current model turn's tokens begin (a continued turn spans an abort)
    num_model_turns: int = 0
    phase: str = "env"  # "env" (reset or step running), "turn" (engine generating), "done"
    turn_handle: BatchHandle | None = None
    turn_deadline: float = float("inf")
    turn_limited_by_total: bool = False
    ending: str = ""  # a finish reason forced from outside (abort, timeouts)


class EpisodeBatch(BatchHandle):
    """The handle of one submitted batch of episodes."""

    def __init__(self, num_samples: int, on_finish):
        super().__init__(num_samples, on_finish)
        self.episodes: list[_Episode] = []


class EpisodeEngine:
    """Runs episodes over an engine, turn by turn (single-turn samples go to the engine itself:
    generate_stream.py chooses)."""

    def __init__(
        self, engine: Engine, codec: TextCodec, limits: Callable[[], EpisodeLimits], num_workers: int
    ):
        self.engine = engine
        self.codec = codec
        self.limits = limits
        self.pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="environment")
        self._lock = threading.Lock()
        self._active: set[_Episode] = set()
        self._wake = threading.Condition(self._lock)
        self._watchdog = threading.Thread(target=self._watch, name="episode-watchdog", daemon=True)
        self._closed = False
        self._watchdog.start()

    # --- the engine interface GenerateStream uses ---

    @property
    def running(self) -> bool:
        return self.engine.running and not self._closed

    def submit(self, requests: list[SampleRequest], on_finish) -> BatchHandle:
        """Start an episode for each request (each has its episode spec)."""
        batch = EpisodeBatch(len(requests), on_finish)
        limits = self.limits()
        now = time.monotonic()
        with self._lock:
            for request in requests:
                episode = _Episode(request, request.episode, batch, deadline=now + limits.episode_timeout)
                batch.episodes.append(episode)
                self._active.add(episode)
            self._wake.notify_all()
        for episode in batch.episodes:
            self.pool.submit(self._start, episode, limits)
        return batch

    def abort(self, handle: EpisodeBatch) -> int:
        return sum(self._force(e, FINISH_ABORT) for e in handle.episodes)

    def abort_all(self) -> int:
        """Every episode and every request of the engine (episodes' turns and single turns)."""
        with self._lock:
            episodes = list(self._active)
        return sum(self._force(e, FINISH_ABORT) for e in episodes) + self.engine.abort_all()

    def close(self) -> None:
        self.abort_all()
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        # Queued work still runs: every episode sees its abort and finishes (none is left unreported).
        self.pool.shutdown(wait=False)

    # --- one episode ---

    def _start(self, ep: _Episode, limits: EpisodeLimits) -> None:
        spec, request = ep.spec, ep.request
        try:
            ep.env = spec.new_environment()
            ep.env.reset(
                EpisodeStart(
                    prompt=self.codec.decode(request.prompt_token_ids),
                    label=spec.label,
                    metadata=dict(spec.metadata),
                    prompt_token_ids=request.prompt_token_ids,
                    resumed=bool(spec.prefix_token_ids),
                )
            )
            prompt = ep.env.episode_prompt_token_ids()
            if prompt:  # the environment chose the prompt (an agent's first request): it is recorded
                ep.request = replace(ep.request, prompt_token_ids=tuple(prompt))
            self._restore_prefix(ep)
        except Exception as exc:  # the environment's own code: any failure fails the sample
            self._env_failed(ep, "reset", exc)
            return
        if self._timed_out_meanwhile(ep):
            return
        self._next_turn(ep, limits)

    def _restore_prefix(self, ep: _Episode) -> None:
        """A continuation: take over the aborted response and replay its finished model turns."""
        spec = ep.spec
        if not spec.prefix_token_ids:
            return
        n = len(spec.prefix_token_ids)
        ep.tokens = list(spec.prefix_token_ids)
        ep.log_probs = list(spec.prefix_log_probs) or [0.0] * n
        ep.loss_mask = list(spec.prefix_loss_mask) or [1] * n
        ep.turns = [replace(t) for t in spec.prefix_turns] or [TurnRecord(MODEL, n)]
        start = 0
        for i, turn in enumerate(ep.turns):
            previous = ep.turns[i - 1].role if i else ENVIRONMENT
            if turn.role == MODEL and previous != MODEL:
                ep.num_model_turns += 1
                ep.turn_start = start
            nxt = ep.turns[i + 1].role if i + 1 < len(ep.turns) else ""
            if turn.role == MODEL and nxt == ENVIRONMENT:  # a finished model turn: replay it
                ids = tuple(ep.tokens[ep.turn_start : start + turn.num_tokens])
                ep.env.step(ModelTurn(self.codec.decode(ids), ids, "stop"))
            start += turn.num_tokens
        if ep.turns[-1].role == ENVIRONMENT:
            ep.turn_start = n

    def _next_turn(self, ep: _Episode, limits: EpisodeLimits) -> None:
        params = ep.request.params
        response_room = limits.max_context_len - len(ep.request.prompt_token_ids) - len(ep.tokens)
        if limits.max_total_tokens:
            response_room = min(response_room, limits.max_total_tokens - len(ep.tokens))
        if response_room <= 0:
            self._finish(ep, FINISH_MAX_TOKENS)
            return
        continuing = ep.turn_start < len(ep.tokens)  # the last model turn was cut by an abort
        if not continuing and ep.num_model_turns >= limits.max_turns:
            self._finish(ep, FINISH_MAX_TURNS)
            return
        done_in_turn = len(ep.tokens) - ep.turn_start
        turn_room = params.max_new_tokens - done_in_turn
        if turn_room <= 0:  # a continued turn that had used its whole budget when it was cut
            self._finish(ep, FINISH_LENGTH)
            return
        max_new = min(turn_room, response_room)
        seed = None if params.seed is None else (params.seed + ep.num_model_turns * SEED_STRIDE) % 2**63
        turn = replace(
            ep.request,
            prompt_token_ids=ep.request.prompt_token_ids + tuple(ep.tokens),
            params=replace(params, max_new_tokens=max_new, seed=seed),
            episode=None,
        )
        with self._lock:
            if ep.ending:  # aborted or timed out between turns
                ending = ep.ending
            else:
                ending = ""
                if not continuing:
                    ep.num_model_turns += 1
                    ep.turn_start = len(ep.tokens)
                ep.phase = "turn"
                ep.turn_limited_by_total = response_room < turn_room
                ep.turn_deadline = time.monotonic() + limits.turn_timeout
                try:
                    ep.turn_handle = self.engine.submit([turn], lambda r: self._hand_over(ep, r))
                except Exception as exc:  # weights released, engine stopped: the call fails as it would
                    ep.phase = "env"
                    ending = f"error:{exc}"
        if ending.startswith("error:"):
            self._finish(ep, FINISH_ABORT, engine_error=ending.removeprefix("error:"))
        elif ending:
            self._finish(ep, ending)

    def _hand_over(self, ep: _Episode, result: SampleResult) -> None:
        """From the engine thread: the turn's result goes to a worker (it may step the environment)."""
        try:
            self.pool.submit(self._after_turn, ep, result)
        except RuntimeError:  # closed (the run ended): no more steps, the episode ends here
            self._finish(ep, FINISH_ABORT)

    def _after_turn(self, ep: _Episode, result: SampleResult) -> None:
        with self._lock:
            ep.phase, ep.turn_handle, ep.turn_deadline = "env", None, float("inf")
        if result.error:
            self._finish(ep, FINISH_ABORT, engine_error=result.error, retryable=result.retryable)
            return
        if result.token_ids:
            ep.tokens += result.token_ids
            ep.log_probs += result.log_probs
            ep.loss_mask += [1] * len(result.token_ids)
            ep.turns.append(TurnRecord(MODEL, len(result.token_ids), result.weight_version))
        if ep.ending:
            self._finish(ep, ep.ending)
            return
        if result.finish_reason == FINISH_ABORT:
            self._finish(ep, FINISH_ABORT)
            return
        ids = tuple(ep.tokens[ep.turn_start :])
        turn = ModelTurn(
            self.codec.decode(ids),
            ids,
            result.finish_reason,
            log_probs=tuple(ep.log_probs[ep.turn_start :]),
            weight_version=result.weight_version,
        )
        if result.finish_reason == FINISH_LENGTH:
            self._tell_cut(ep, turn)
            self._finish(ep, FINISH_MAX_TOKENS if ep.turn_limited_by_total else FINISH_LENGTH)
            return
        try:
            step = ep.env.step(turn)
            observation = self.codec.observation_ids(step) if not step.done else ()
            metrics = {str(name): float(value) for name, value in step.metrics.items()}
        except Exception as exc:
            self._env_failed(ep, "step", exc)
            return
        if self._timed_out_meanwhile(ep):
            return
        self._apply_step(ep, step, observation, metrics)

    def _apply_step(
        self, ep: _Episode, step: Step, observation: tuple[int, ...], metrics: dict[str, float]
    ) -> None:
        for turn in reversed(ep.turns):  # the reward belongs to the (last part of the) model turn
            if turn.role == MODEL:
                turn.reward += float(step.reward)
                break
        ep.metrics.update(metrics)
        if step.done:
            self._finish(ep, "stop")
            return
        limits = self.limits()
        if observation:
            room = limits.max_context_len - len(ep.request.prompt_token_ids) - len(ep.tokens)
            if limits.max_total_tokens:
                room = min(room, limits.max_total_tokens - len(ep.tokens))
            if len(observation) >= room:  # no room left for the model to answer it
                self._finish(ep, FINISH_MAX_TOKENS)
                return
            ep.tokens += observation
            ep.log_probs += [0.0] * len(observation)
            ep.loss_mask += [0] * len(observation)
            ep.turns.append(TurnRecord(ENVIRONMENT, len(observation)))
        ep.turn_start = len(ep.tokens)
        if ep.ending:
            self._finish(ep, ep.ending)
            return
        self._next_turn(ep, limits)

    def _tell_cut(self, ep: _Episode, turn: ModelTurn) -> None:
        try:
            ep.env.episode_cut(turn)
        except Exception as exc:  # the episode ends anyway; the environment's failure is only logged
            log.warning("environment episode_cut failed", error=f"{type(exc).__name__}: {exc}")

    def _timed_out_meanwhile(self, ep: _Episode) -> bool:
        """The episode timed out while its environment was busy: it was reported then; close now."""
        with self._lock:
            done = ep.phase == "done"
        if done:
            self._close_env(ep)
        return done

    def _close_env(self, ep: _Episode) -> None:
        if ep.env is None:
            return
        try:
            ep.env.close()
        except Exception as exc:
            log.warning("environment close failed", error=f"{type(exc).__name__}: {exc}")

    def _env_failed(self, ep: _Episode, what: str, exc: Exception) -> None:
        failure = f"environment {what} failed: {type(exc).__name__}: {exc}"
        log.warning("episode failed", index=ep.request.index, error=failure)
        self._finish(ep, FINISH_FAILED, failure=failure)

    def _force(self, ep: _Episode, reason: str) -> int:
        """End an episode from outside (abort, timeouts): a turn in flight is aborted in the engine
        (its result finishes the episode); an episode timing out in a step finishes now."""
        with self._lock:
            if ep.phase == "done" or ep.ending:
                return 0
            ep.ending = reason
            handle = ep.turn_handle if ep.phase == "turn" else None
            finish_now = ep.phase == "env" and reason == FINISH_EPISODE_TIMEOUT
            env = ep.env if ep.phase == "env" else None
        if handle is not None:
            self.engine.abort(handle)
        elif finish_now:
            self._finish(ep, reason, defer_close=True)  # the thread in reset or step closes it
        if env is not None:  # an environment waiting on something outside (an agent) returns now
            try:
                env.interrupt()
            except Exception as exc:
                log.warning("environment interrupt failed", error=f"{type(exc).__name__}: {exc}")
        return 1

    def _finish(
        self,
        ep: _Episode,
        reason: str,
        *,
        failure: str = "",
        engine_error: str = "",
        retryable: bool = False,
        defer_close: bool = False,
    ) -> None:
        with self._lock:
            if ep.phase == "done":
                return
            ep.phase = "done"
            self._active.discard(ep)
        if not defer_close:
            self._close_env(ep)
        versions = [t.weight_version for t in ep.turns if t.role == MODEL]
        result = SampleResult(
            ep.request,
            token_ids=list(ep.tokens),
            log_probs=list(ep.log_probs),
            finish_reason=reason,
            text=self.codec.decode(tuple(ep.tokens)),
            weight_version=min(versions) if versions else self.engine.weight_version,
            error=engine_error,
            retryable=retryable,
            episode=EpisodeOutcome(
                loss_mask=list(ep.loss_mask),
                turns=list(ep.turns),
                reward=sum(t.reward for t in ep.turns),
                failure=failure,
                metrics=dict(ep.metrics),
            ),
        )
        ep.batch.finish(result)

    def _watch(self) -> None:
        """Enforce the turn and episode timeouts."""
        while True:
            with self._lock:
                if self._closed:
                    return
                if not self._active:
                    self._wake.wait()
                    continue
                now = time.monotonic()
                late = [
                    (e, FINISH_EPISODE_TIMEOUT if now > e.deadline else FINISH_TURN_TIMEOUT)
                    for e in self._active
                    if not e.ending and (now > e.deadline or now > e.turn_deadline)
                ]
            for ep, reason in late:
                self._force(ep, reason)
            with self._lock:
                self._wake.wait(WATCHDOG_SECONDS)
