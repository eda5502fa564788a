"""The hf engine's scheduler: continuous (or static) batching over a left-padded KV cache.

    submit() ─> waiting ─admit─> prefill unique prompts ─> repeat rows per sample ─> merge ─┐
                                                                                          v
    loop thread:   live rows ─> one decode forward ─> sample (per-row generator) ─> stop checks
                                                                                          │
                   finished rows leave the batch ─> SampleResult ─> the batch's on_finish <┘

Continuous: whenever rows finish, waiting samples are prefilled and join the running batch at
the next step (in chunks of at least 1/8 of the batch, so joins are not paid for one row at a
time). Static: a new batch starts only once every row of the previous one has finished. Either
way each sample is reported the moment it finishes, and exactly once: `stop` reports every row
still waiting or running as aborted, so no caller waits for a sample that will never come.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rollway.common import progress
from rollway.common.log import get_logger
from rollway.rollout.engines.base import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    BatchHandle,
    SampleRequest,
    SampleResult,
)
from rollway.rollout.engines.kv_cache import PaddedBatch, prefill_inputs
from rollway.rollout.sampling import make_generator, sample_tokens

log = get_logger("rollway.rollout.hf")

# Prefill at most this many prompt tokens (padded) per forward; longer admissions are split.
MAX_PREFILL_TOKENS = 16384


@dataclass(eq=False)
class _Row:
    request: SampleRequest
    handle: BatchHandle
    stop_ids: frozenset[int]
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    aborted: bool = False
    emitted: bool = False  # reported to its handle (once: by the loop, an abort or stop)


class Batcher:
    """Runs generation on its own thread; `model` is swapped to None while weights are released."""

    def __init__(
        self,
        model,
        tokenizer,
        eos_ids: frozenset[int],
        *,
        max_rows: int,
        static: bool,
        weight_version: Callable[[], int],
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_rows = max_rows
        self.static = static
        self.weight_version = weight_version
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.model_lock = threading.Lock()  # held during each forward; weight loads take it too
        self._cond = threading.Condition()
        self._waiting: deque[_Row] = deque()
        self._live: list[_Row] = []
        self._admitting: list[_Row] = []
        self._batch: PaddedBatch | None = None
        self._stopped = False
        self._reported_all = False
        self._thread = threading.Thread(target=self._run, name="hf-batcher", daemon=True)
        self.num_forwards = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the loop (after the forward in progress, waiting at most `timeout` seconds) and report
        every row still waiting or running as aborted."""
        with self._cond:
            self._stopped = True
            rows = [*self._waiting, *self._live, *self._admitting]
            self._waiting.clear()
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "generation step still running at stop; its rows are reported aborted", timeout=timeout
            )
        for row in rows:
            self._emit(row, FINISH_ABORT)
        self._reported_all = True

    @property
    def running(self) -> bool:
        """False once no row will be reported any more: stop() has reported them all, or the loop died."""
        return not self._reported_all and (self._stopped or self._thread.is_alive())

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._waiting and not self._live and not self._admitting

    @property
    def num_in_flight(self) -> int:
        with self._cond:
            return len(self._waiting) + len(self._live) + len(self._admitting)

    def submit(self, requests: list[SampleRequest], handle: BatchHandle) -> None:
        rows = [_Row(r, handle, self.eos_ids | r.params.stop_token_ids) for r in requests]
        with self._cond:
            self._waiting.extend(rows)
            self._cond.notify_all()

    def abort(self, handle: BatchHandle | None) -> int:
        """Abort the rows of `handle` (None: all rows). Waiting rows end here, live ones at the next step."""
        with self._cond:
            dropped = [r for r in self._waiting if handle is None or r.handle is handle]
            self._waiting = deque(r for r in self._waiting if not (handle is None or r.handle is handle))
            running = [*self._live, *self._admitting]
            marked = [r for r in running if (handle is None or r.handle is handle) and not r.aborted]
            for row in marked:
                row.aborted = True
            self._cond.notify_all()
        for row in dropped:
            self._emit(row, FINISH_ABORT)
        return len(dropped) + len(marked)

    def abort_all(self) -> int:
        return self.abort(None)

    # --- the loop ---

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self._waiting and not self._live:
                    self._cond.wait()
                if self._stopped:
                    return
                admitted = self._admitting = self._take_admissions()
            try:
                self._iteration(admitted)
                progress.beat()  # a decode step: for the coordinator's hang watch
            except Exception as exc:
                log.exception("generation step failed")
                self._fail_live(admitted, f"{type(exc).__name__}: {exc}")
            with self._cond:
                self._admitting = []

    def _take_admissions(self) -> list[_Row]:
        free = self.max_rows - len(self._live)
        if not self._waiting or free <= 0 or (self.static and self._live):
            return []
        chunk = max(1, self.max_rows // 8)
        if self._live and free < min(chunk, len(self._waiting)):
            return []
        return [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]

    def _iteration(self, admitted: list[_Row]) -> None:
        self._drop_aborted()
        with self.model_lock:
            if self.model is None:
                raise RuntimeError("model weights are released")
            if admitted:
                self._admit(admitted)
                self._drop_finished()  # a first token may already end a sample
            if self._batch is not None and self._live:
                self._decode_step()
        self._drop_finished()

    def _admit(self, rows: list[_Row]) -> None:
        for row in rows:
            row.generator = None if row.request.params.greedy else make_generator(row.request.params.seed)
        first_prompt: dict[tuple[int, int], _Row] = {}
        for row in rows:
            first_prompt.setdefault((id(row.handle), row.request.prompt_key), row)
        unique = list(first_prompt)
        per_forward = max(1, MAX_PREFILL_TOKENS // max(len(r.request.prompt_token_ids) for r in rows))
        for start in range(0, len(unique), per_forward):
            keys = unique[start : start + per_forward]
            wanted = set(keys)
            members = [r for r in rows if (id(r.handle), r.request.prompt_key) in wanted]
            batch, logits = self._prefill([first_prompt[k].request.prompt_token_ids for k in keys])
            local = {key: i for i, key in enumerate(keys)}
            mapping = torch.tensor([local[(id(r.handle), r.request.prompt_key)] for r in members])
            batch.repeat_rows(mapping.to(batch.mask.device))
            tokens = self._sample_and_record(members, logits.index_select(0, mapping.to(logits.device)))
            batch.next_tokens = tokens
            self._join(batch, members)

    def _prefill(self, prompts: list[tuple[int, ...]]) -> tuple[PaddedBatch, torch.Tensor]:
        device = next(self.model.parameters()).device
        inputs = prefill_inputs(prompts, self.pad_token_id, device)
        out = self.model(**inputs, use_cache=True, logits_to_keep=1)
        self.num_forwards += 1
        mask = inputs["attention_mask"]
        batch = PaddedBatch(out.past_key_values, mask, mask.sum(dim=1), mask.new_zeros(len(prompts)))
        return batch, out.logits[:, -1, :]

    def _join(self, batch: PaddedBatch, members: list[_Row]) -> None:
        # Under the lock, so a row is never seen both admitting and live (it would be counted,
        # and aborted, twice).
        with self._cond:
            if self._batch is None or not self._live:
                self._batch = batch
                self._live = list(members)
            else:
                self._batch.merge(batch)
                self._live.extend(members)
            joined = set(members)
            self._admitting = [r for r in self._admitting if r not in joined]

    def _decode_step(self) -> None:
        assert self._batch is not None
        out = self.model(**self._batch.step_inputs(), use_cache=True)
        self.num_forwards += 1
        tokens = self._sample_and_record(self._live, out.logits[:, -1, :])
        self._batch.advance(tokens)

    def _sample_and_record(self, rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
        tokens, log_probs = sample_tokens(
            logits, [r.request.params for r in rows], [r.generator for r in rows]
        )
        for row, token, log_prob in zip(rows, tokens.tolist(), log_probs.tolist(), strict=True):
            row.tokens.append(token)
            row.log_probs.append(log_prob)
            row.finish_reason = self._finish_reason(row)
        return tokens.to(logits.device)

    def _finish_reason(self, row: _Row) -> str:
        params = row.request.params
        if row.tokens[-1] in row.stop_ids:
            return FINISH_STOP
        if params.stop and self._stop_string_hit(row):
            return FINISH_STOP
        if len(row.tokens) >= params.max_new_tokens:
            return FINISH_LENGTH
        return ""

    def _stop_string_hit(self, row: _Row) -> bool:
        # Every non-special token decodes to at least one byte, so a stop string of n characters
        # (at most 4n bytes) lies within the last 4n tokens.
        window = 4 * max(len(s) for s in row.request.params.stop)
        text = self.tokenizer.decode(row.tokens[-window:], skip_special_tokens=True)
        return any(s in text for s in row.request.params.stop)

    def _drop_finished(self) -> None:
        done = [r for r in self._live if r.finish_reason]
        if not done:
            return
        self._keep_rows([r for r in self._live if not r.finish_reason])
        for row in done:
            self._emit(row, row.finish_reason)

    def _drop_aborted(self) -> None:
        with self._cond:
            aborted = [r for r in self._live if r.aborted]
            if aborted:
                self._keep_rows([r for r in self._live if not r.aborted])
        for row in aborted:
            self._emit(row, FINISH_ABORT)

    def _keep_rows(self, keep: list[_Row]) -> None:
        if self._batch is not None and keep:
            index = {id(r): i for i, r in enumerate(self._live)}
            rows = torch.tensor([index[id(r)] for r in keep], device=self._batch.mask.device)
            self._batch.select(rows)
            self._batch.trim()
        else:
            self._batch = None
        self._live = keep

    def _fail_live(self, admitted: list[_Row], error: str) -> None:
        with self._cond:
            failed = list(dict.fromkeys([*self._live, *admitted]))
            self._live, self._batch = [], None
        for row in failed:
            self._emit(row, FINISH_ABORT, error=error)

    def _emit(self, row: _Row, finish_reason: str, error: str = "") -> None:
        with self._cond:
            if row.emitted:
                return
            row.emitted = True
        # Copies: after a stop that timed out, the loop may still append to the row.
        log_probs = list(row.log_probs)
        tokens = row.tokens[: len(log_probs)]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if finish_reason == FINISH_STOP and row.request.params.stop:
            # Like SGLang: the text ends before the matched stop string; the tokens keep it.
            cuts = [text.find(s) for s in row.request.params.stop if s in text]
            text = text[: min(cuts)] if cuts else text
        result = SampleResult(
            request=row.request,
            token_ids=tokens,
            log_probs=log_probs,
            finish_reason=finish_reason,
            text=text,
            weight_version=self.weight_version(),
            error=error,
        )
        row.handle.finish(result)
