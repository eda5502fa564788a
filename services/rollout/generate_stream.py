"""One Generate call: queue samples, score them as they finish, stream them in finish order.

    engine thread ──SampleResult──┐
                                  v
    reward pool ──(rewards)──> events queue ──> this call's thread ──> yield GenerateResponse
                                  ^
    per-sample reward: scored as soon as its sample finishes;
    group reward:      scored once every sample of its prompt has finished.

Aborted samples are streamed without a reward. If the engine fails a sample, the call ends with
an error (its other samples are aborted); if the client goes away, its samples are aborted.
The events queue is read in short slices, so this thread never outlives its call: a cancelled
call returns at once, and a stopped engine (every row reported) ends it with UNAVAILABLE.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from rollway.common.errors import FailedPrecondition, Unavailable, Unimplemented
from rollway.common.log import get_logger
from rollway.common.structs import from_struct
from rollway.common.v1 import common_pb2
from rollway.rollout import episode_spec
from rollway.rollout.engines.base import (
    FINISH_ABORT,
    FINISH_LENGTH,
    BatchHandle,
    Engine,
    EngineError,
    EngineStateError,
    EngineUnsupported,
    SampleResult,
)
from rollway.rollout.episodes import EpisodeEngine
from rollway.rollout.generate_queue import SHUTTING_DOWN
from rollway.rollout.generation_gate import GenerationGate
from rollway.rollout.request_validation import GenerationPlan
from rollway.rollout.rewards import NO_REWARD, RewardFunction, RewardRunner, RewardSample
from rollway.rollout.v1 import rollout_pb2

log = get_logger("rollway.rollout.generate")

POLL_SECONDS = 0.5  # how often a waiting stream checks its client and the engine


def whole_despite_abort(result: SampleResult) -> SampleResult:
    """A single-turn sample aborted after its last token is whole: an abort can overtake a sample
    that generated all of max_new_tokens before the engine reported it (the hf batcher emits at its
    next step, SGLang answers the abort first). Reported as aborted, a partial rollout would try to
    continue it with nothing left to generate, which the next Generate refuses."""
    whole = len(result.token_ids) >= result.request.params.max_new_tokens
    if result.finish_reason != FINISH_ABORT or result.error or result.episode is not None or not whole:
        return result
    return replace(result, finish_reason=FINISH_LENGTH)


FINISH_REASONS = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
    episode_spec.FINISH_MAX_TURNS: common_pb2.FINISH_REASON_MAX_TURNS,
    episode_spec.FINISH_MAX_TOKENS: common_pb2.FINISH_REASON_MAX_TOKENS,
    episode_spec.FINISH_TURN_TIMEOUT: common_pb2.FINISH_REASON_TURN_TIMEOUT,
    episode_spec.FINISH_EPISODE_TIMEOUT: common_pb2.FINISH_REASON_EPISODE_TIMEOUT,
    episode_spec.FINISH_FAILED: common_pb2.FINISH_REASON_FAILED,
}


@dataclass
class Counters:
    """Service-wide counts reported by GetInfo."""

    num_samples_generated: int = 0
    num_samples_aborted: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, aborted: bool, num_samples: int = 1) -> None:
        with self._lock:
            self.num_samples_generated += num_samples
            self.num_samples_aborted += num_samples if aborted else 0


@dataclass
class _Scored:
    samples: list[common_pb2.Sample]
    rewards: list[float]
    error: str


class RunningCalls:
    """The admitted Generate calls' batches, by request_id, each with what runs it (the engine,
    or the episode runner): what Abort aborts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[str, list[tuple[Engine | EpisodeEngine, BatchHandle]]] = {}

    def add(self, request_id: str, runner: Engine | EpisodeEngine, handle: BatchHandle) -> None:
        with self._lock:
            self._batches.setdefault(request_id, []).append((runner, handle))

    def remove(self, request_id: str, handle: BatchHandle) -> None:
        with self._lock:
            batches = [b for b in self._batches.get(request_id, []) if b[1] is not handle]
            if batches:
                self._batches[request_id] = batches
            else:
                self._batches.pop(request_id, None)

    def abort(self, request_id: str) -> int:
        """Abort the call's batches; how many samples were still running."""
        with self._lock:
            batches = list(self._batches.get(request_id, []))
        return sum(runner.abort(handle) for runner, handle in batches)


@dataclass
class StreamContext:
    """What a Generate call needs from the service."""

    engine: Engine  # single-turn samples go straight to it
    episodes: EpisodeEngine  # samples that are episodes of an environment
    gate: GenerationGate
    rewards: dict[str, RewardFunction]
    runner: RewardRunner
    decode: Callable[[tuple[int, ...]], str]
    # True once the service drains (SIGTERM): calls not yet in the engine end with UNAVAILABLE.
    shutting_down: Callable[[], bool] = lambda: False
    counters: Counters = field(default_factory=Counters)
    running: RunningCalls = field(default_factory=RunningCalls)


class GenerateStream:
    """Runs one validated request (a GenerationPlan) and yields its samples as they are ready."""

    def __init__(self, ctx: StreamContext, request: rollout_pb2.GenerateRequest, plan: GenerationPlan):
        self.ctx = ctx
        self.request = request
        self.plan = plan
        self.reward = None if plan.reward == NO_REWARD else ctx.rewards[plan.reward]
        # Chosen once: an environment's episodes run turn by turn; a single turn is the engine's.
        self.runner = ctx.episodes if plan.samples and plan.samples[0].episode is not None else ctx.engine
        self.events: queue.Queue[SampleResult | _Scored] = queue.Queue()
        self.prompt_texts: dict[int, str] = {}
        self.groups: dict[int, list[common_pb2.Sample]] = defaultdict(list)

    def run(
        self, is_active: Callable[[], bool], on_cancel: Callable[[Callable[[], None]], object]
    ) -> Iterator:
        handle = self._admit(is_active)
        if handle is None:
            return
        on_cancel(lambda: self.runner.abort(handle))
        self.ctx.running.add(self.request.request_id, self.runner, handle)
        num_samples = len(self.plan.samples)
        pending_engine, pending_out = num_samples, num_samples
        start, num_tokens = time.monotonic(), 0
        try:
            while pending_out:
                event = self._next_event(is_active)
                if event is None:
                    return  # the client went away: its unfinished samples are aborted below
                if isinstance(event, SampleResult):
                    pending_engine -= 1
                    if pending_engine == 0:
                        self.ctx.gate.release()
                    ready = self._on_result(event)
                else:
                    ready = self._apply_rewards(event)
                for sample in ready:
                    pending_out -= 1
                    num_tokens += len(sample.response_token_ids)
                    yield rollout_pb2.GenerateResponse(sample=sample)
            seconds = time.monotonic() - start
            log.info("generate done", num_samples=num_samples, output_tokens=num_tokens,
                     seconds=round(seconds, 3), output_tokens_per_s=round(num_tokens / max(seconds, 1e-9), 1))  # fmt: skip
        finally:
            self.ctx.running.remove(self.request.request_id, handle)
            if pending_engine:  # the client went away (or the stream failed): the rest is aborted
                self.runner.abort(handle)
                self.ctx.gate.release()
                self.ctx.counters.count(aborted=True, num_samples=pending_engine)

    def _next_event(self, is_active: Callable[[], bool]) -> SampleResult | _Scored | None:
        """The next finished sample or scored batch; None once the client has gone away."""
        while True:
            try:
                return self.events.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if not is_active():
                    return None
                if not self.runner.running:
                    raise Unavailable("the engine stopped before every sample finished; retry") from None

    def _admit(self, is_active):
        def submit() -> BatchHandle:
            if self.ctx.shutting_down():
                raise Unavailable(SHUTTING_DOWN)
            return self.runner.submit(self.plan.samples, self.events.put)

        try:
            handle = self.ctx.gate.admit(submit, lambda: is_active() and not self.ctx.shutting_down())
        except EngineStateError as exc:
            raise FailedPrecondition(str(exc)) from None
        if handle is None and self.ctx.shutting_down():
            raise Unavailable(SHUTTING_DOWN)  # waited for Resume until the service began to drain
        return handle

    def _on_result(self, result: SampleResult) -> list[common_pb2.Sample]:
        if result.error:
            error = f"engine failed sample {result.request.index}: {result.error}"
            raise Unavailable(error) if result.retryable else RuntimeError(error)
        result = whole_despite_abort(result)
        sample = self._to_sample(result)
        self.ctx.counters.count(aborted=result.finish_reason == FINISH_ABORT)
        if self.reward is None:
            return [sample]
        if not self.reward.group:
            if result.finish_reason == FINISH_ABORT:
                return [sample]
            self._score([sample])
            return []
        group = self.groups[result.request.prompt_key]
        group.append(sample)
        if len(group) < self.plan.n_samples_per_prompt:
            return []
        scorable = [s for s in group if s.finish_reason != common_pb2.FINISH_REASON_ABORT]
        if scorable:
            self._score(scorable)
        return [s for s in group if s.finish_reason == common_pb2.FINISH_REASON_ABORT]

    def _score(self, samples: list[common_pb2.Sample]) -> None:
        assert self.reward is not None
        inputs = [self._reward_input(s) for s in samples]
        self.ctx.runner.score(self.reward, inputs, lambda r, e: self.events.put(_Scored(samples, r, e)))

    def _apply_rewards(self, scored: _Scored) -> list[common_pb2.Sample]:
        for sample, reward in zip(scored.samples, scored.rewards, strict=True):
            sample.reward = sample.raw_reward = reward
            sample.reward_error = scored.error
        return scored.samples

    def _to_sample(self, result: SampleResult) -> common_pb2.Sample:
        if result.episode is not None:
            return self._episode_sample(result)
        p = result.request.prompt_key
        prompt = self.request.prompts[p]
        prefix = prompt.response_prefix  # empty unless this continues an aborted sample
        response = [*prefix.token_ids, *result.token_ids]
        sample = common_pb2.Sample(
            group_index=self.plan.group_indices[p],
            index=result.request.index,
            prompt_token_ids=self.plan.prompt_token_ids[p],
            response_token_ids=response,
            loss_mask=[1] * len(response),
            rollout_log_probs=[*prefix.log_probs, *result.log_probs],
            finish_reason=FINISH_REASONS[result.finish_reason],
            weight_version=result.weight_version,
            source=prompt.source,
            label=prompt.label,
            response_text=self.ctx.decode(tuple(prefix.token_ids)) + result.text
            if prefix.token_ids
            else result.text,
        )
        if prompt.HasField("metadata"):
            sample.metadata.CopyFrom(prompt.metadata)
        return sample

    def _episode_sample(self, result: SampleResult) -> common_pb2.Sample:
        """A finished episode: its tokens (resumed prefix included), loss mask, turns and reward."""
        outcome = result.episode
        p = result.request.prompt_key
        prompt = self.request.prompts[p]
        sample = common_pb2.Sample(
            group_index=self.plan.group_indices[p],
            index=result.request.index,
            # The engine request's prompt: an environment may have chosen it (an agent's first request).
            prompt_token_ids=result.request.prompt_token_ids,
            response_token_ids=result.token_ids,
            loss_mask=outcome.loss_mask,
            rollout_log_probs=result.log_probs,
            finish_reason=FINISH_REASONS[result.finish_reason],
            weight_version=result.weight_version,
            source=prompt.source,
            label=prompt.label,
            response_text=result.text,
            reward=outcome.reward,
            raw_reward=outcome.reward,
            reward_error=outcome.failure,
            metrics=outcome.metrics,
            turns=[
                common_pb2.Turn(
                    role=t.role, num_tokens=t.num_tokens, weight_version=t.weight_version, reward=t.reward
                )
                for t in outcome.turns
            ],
        )
        if prompt.HasField("metadata"):
            sample.metadata.CopyFrom(prompt.metadata)
        return sample

    def _reward_input(self, sample: common_pb2.Sample) -> RewardSample:
        p = sample.index // self.plan.n_samples_per_prompt
        if p not in self.prompt_texts:
            self.prompt_texts[p] = self.ctx.decode(tuple(sample.prompt_token_ids))
        finish = {v: k for k, v in FINISH_REASONS.items()}[sample.finish_reason]
        return RewardSample(
            prompt=self.prompt_texts[p],
            response=sample.response_text,
            label=sample.label,
            metadata=from_struct(sample.metadata),
            prompt_token_ids=tuple(sample.prompt_token_ids),
            response_token_ids=tuple(sample.response_token_ids),
            finish_reason=finish,
            group_index=sample.group_index,
            index=sample.index,
            source=sample.source,
        )


def engine_error_status(exc: EngineError) -> Exception:
    """The status an engine error answers with (a plain exception is INTERNAL)."""
    if isinstance(exc, EngineUnsupported):
        return Unimplemented(str(exc))
    if isinstance(exc, EngineStateError):
        return FailedPrecondition(str(exc))
    return Unavailable(str(exc)) if exc.retryable else RuntimeError(str(exc))
