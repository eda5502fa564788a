"""The served stream: batches, the committed cursor, counters, idempotent retries, save/restore.

The committed cursor is the order's position just after the last item served; items that
are prefetched but not served are not part of it. So a state taken at any time, restored in
a fresh service, continues with exactly the items the uninterrupted stream would serve next,
and nothing prefetched is lost or served twice. Counters travel with the cursor.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from rollway.common.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, ResourceExhausted
from rollway.common.log import get_logger
from rollway.dataloader.datasets import OpenedSource
from rollway.dataloader.encoder import Encoder
from rollway.dataloader.items import ItemFactory
from rollway.dataloader.order import make_order
from rollway.dataloader.prefetch import Prefetcher, StreamError
from rollway.dataloader.v1 import dataloader_pb2

log = get_logger(__name__)

STATE_VERSION = 1
CACHED_BATCHES = 4
BASE_COUNTERS = ("items_served", "dropped_too_long", "skipped_bad_rows", "rejected_by_tokenizer")


@dataclass(frozen=True)
class StreamSettings:
    """What shapes the stream besides the data: order, limits, prefetch."""

    mode: str  # "rl" or "sft"
    weights: list[float] | None
    seed: int
    shuffle: bool
    num_epoch: int
    max_len: int
    skip_bad_rows: bool
    prefetch_size: int
    max_message_bytes: int = 64 * 2**20


class DataStream:
    """Serves batches from opened sources; thread-safe."""

    def __init__(self, sources: list[OpenedSource], encoder: Encoder, settings: StreamSettings):
        self.sources = sources
        self.encoder = encoder
        self.settings = settings
        self._lock = threading.Lock()
        self._batches: OrderedDict[int, tuple[int, dataloader_pb2.NextBatchResponse]] = OrderedDict()
        self._start(settings.seed, settings.shuffle, None, Counter(), 0)

    def _start(
        self, seed: int, shuffle: bool, cursor: dict | None, counters: Counter, num_batches: int
    ) -> None:
        s = self.settings
        self._order = make_order([len(x.store) for x in self.sources], s.weights, seed, shuffle, s.num_epoch)
        if cursor is not None:
            self._order.restore(cursor)
        self.seed, self.shuffle = seed, shuffle
        self._cursor = self._order.state()
        self._counters = counters
        self._num_batches = num_batches
        factory = ItemFactory(self.sources, self.encoder, self._order, s.max_len, s.skip_bad_rows)
        self._prefetcher = Prefetcher(factory.next_entry, s.prefetch_size)
        self._prefetcher.start()

    def close(self) -> None:
        self._prefetcher.stop()

    @property
    def bad_rows_at_open(self) -> int:
        return sum(source.num_bad_rows for source in self.sources)

    def counters(self) -> dict[str, int]:
        """Cumulative counters as of the last served batch."""
        counters = {name: 0 for name in BASE_COUNTERS}
        counters.update(dict(self._counters))  # a copy: Describe may read while a batch is served
        counters["bad_rows_at_open"] = self.bad_rows_at_open
        counters["skipped_bad_rows"] += self.bad_rows_at_open
        counters["batches_served"] = self._num_batches
        return counters

    @property
    def epoch(self) -> int:
        return self._order.epoch_of(self._cursor)

    @property
    def exhausted(self) -> bool:
        return self._order.finished(self._cursor)

    def next_batch(self, batch_id: int, batch_size: int, timeout: float) -> dataloader_pb2.NextBatchResponse:
        """The batch `batch_id`: served once, then answered from the cache on retries.

        A new batch_id must be the number of batches served so far (ids count batches from 0, and a
        restored cursor carries its count). Any other id is refused before the stream is touched, so
        a stray id (-1, 10**12) cannot move the expected id away from the caller's real ones."""
        with self._lock:
            cached = self._batches.get(batch_id)
            if cached is not None:
                if cached[0] != batch_size:
                    raise InvalidArgument(
                        "batch_size",
                        f"batch_id {batch_id} was served with batch_size {cached[0]}, not {batch_size}",
                    )
                return cached[1]
            if batch_id != self.expected_batch_id:
                raise InvalidArgument(
                    "batch_id", f"{batch_id} is outside the expected range: {self._expected_range()}"
                )
            response = self._serve(batch_size, timeout)
            self._batches[batch_id] = (batch_size, response)
            while len(self._batches) > CACHED_BATCHES:
                self._batches.popitem(last=False)
            return response

    @property
    def expected_batch_id(self) -> int:
        """The batch_id of the next new batch (a caller counting batches from 0 sends exactly this)."""
        return self._num_batches

    def _expected_range(self) -> str:
        text = f"expected the next batch_id {self.expected_batch_id}"
        if self._batches:
            ids = list(self._batches)
            text += f" or a retry of batch_id {ids[0]}..{ids[-1]} (the last {len(ids)} served)"
        return text

    def _serve(self, batch_size: int, timeout: float) -> dataloader_pb2.NextBatchResponse:
        entries = []
        if not self.exhausted:
            try:
                entries = self._prefetcher.take(batch_size, timeout)
            except StreamError as exc:
                raise FailedPrecondition(str(exc)) from None
            except TimeoutError as exc:
                raise DeadlineExceeded(f"{exc}; retry the same batch_id") from None
        items = [entry.item for entry in entries if entry.item is not None]
        size = sum(item.ByteSize() for item in items)
        if size > self.settings.max_message_bytes * 0.9:  # leave room for framing and counters
            self._prefetcher.give_back(entries)
            raise ResourceExhausted(
                f"batch_size {batch_size}: these items take {size / 2**20:.1f} MiB, over the "
                f"{self.settings.max_message_bytes / 2**20:.0f} MiB message limit; ask for fewer items"
            )
        for entry in entries:
            self._counters.update(entry.counts)
            self._cursor = entry.cursor
        self._num_batches += 1
        return dataloader_pb2.NextBatchResponse(
            items=items,
            prefetch_queue_depth=self._prefetcher.depth,
            epoch=self.epoch,
            exhausted=self.exhausted,
            counters=self.counters(),
        )

    def fingerprint(self) -> dict[str, Any]:
        """What a state must have been taken with to be restored here."""
        return {
            "mode": self.settings.mode,
            "sources": [
                {"name": s.spec.name, "path": s.spec.spec, "num_rows": len(s.store)} for s in self.sources
            ],
            "weights": self.settings.weights or None,
        }

    def get_state(self) -> tuple[str, int, int]:
        """The committed cursor as versioned JSON, the number of batches served, the epoch."""
        with self._lock:
            state = {
                "version": STATE_VERSION,
                **self.fingerprint(),
                "seed": self.seed,
                "shuffle": self.shuffle,
                "cursor": self._cursor,
                "counters": dict(self._counters),
                "num_batches_served": self._num_batches,
            }
            return json.dumps(state, sort_keys=True), self._num_batches, self.epoch

    def restore(self, state_json: str) -> int:
        """Continue from a state taken with get_state; returns the epoch. Clears the batch cache."""
        state = parse_state(state_json, self.fingerprint())
        with self._lock:
            self._prefetcher.stop()
            try:
                self._start(
                    state["seed"],
                    state["shuffle"],
                    state["cursor"],
                    Counter(state["counters"]),
                    state["num_batches_served"],
                )
            except ValueError as exc:
                self._start(self.seed, self.shuffle, self._cursor, self._counters, self._num_batches)
                raise InvalidArgument("state_json", f"bad cursor: {exc}") from None
            self._batches.clear()
            log.info("restored", epoch=self.epoch, cursor=self._cursor, seed=self.seed)
            return self.epoch


def parse_state(state_json: str, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Check a state's JSON and that it was taken with this dataloader's sources, mode and weights."""
    try:
        state = json.loads(state_json)
    except ValueError as exc:
        raise InvalidArgument("state_json", f"not valid JSON: {exc}") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise InvalidArgument("state_json", f"not a dataloader state of version {STATE_VERSION}")
    for key, expected in fingerprint.items():
        if state.get(key) != expected:
            raise FailedPrecondition(
                f"state_json: taken with {key} {json.dumps(state.get(key))}, but this dataloader has "
                f"{json.dumps(expected)}; a cursor only continues the stream it was taken from"
            )
    checks = {"seed": int, "shuffle": bool, "cursor": dict, "counters": dict, "num_batches_served": int}
    for key, kind in checks.items():
        value = state.get(key)
        if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0)):
            raise InvalidArgument(
                "state_json", f"{key} must be a {'non-negative ' * (kind is int)}{kind.__name__}"
            )
    if not all(isinstance(k, str) and isinstance(v, int) for k, v in state["counters"].items()):
        raise InvalidArgument("state_json", "counters must map names to integers")
    return state
