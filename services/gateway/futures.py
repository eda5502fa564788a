"""Futures of the calls in flight: each call runs on its model's single worker thread, in the
order it arrived (the SDK submits a training client's calls one after the other), and its result
waits here until retrieve_future reads it."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from rollway.gateway.callers import caller, owns

MAX_KEPT = 10_000  # finished futures kept for retrieval (the oldest go first)


class FutureStore:
    """request_id -> concurrent Future, for every tenant (ids are unique across them)."""

    def __init__(self) -> None:
        self._futures: dict[str, tuple[str, str, Future]] = {}  # id -> (owner, caller, future)
        # Ids carry this gateway process's own prefix: one issued before a restart is never
        # mistaken for a new call's.
        self._ids = (f"req-{uuid.uuid4().hex[:6]}-{n}" for n in itertools.count(1))
        self._lock = threading.Lock()

    def submit(self, executor: ThreadPoolExecutor, owner: str, fn: Callable[[], Any]) -> str:
        """Run `fn` on `executor`; the request id that retrieves its result. `owner` is the model
        (or sampling session) the call belongs to."""
        with self._lock:
            request_id = next(self._ids)
            self._futures[request_id] = (owner, caller(), executor.submit(fn))
            while len(self._futures) > MAX_KEPT:
                self._futures.pop(next(iter(self._futures)))
        return request_id

    def done(self, owner: str, value: Any) -> str:
        """A call answered at once (no work to queue)."""
        future: Future = Future()
        future.set_result(value)
        with self._lock:
            request_id = next(self._ids)
            self._futures[request_id] = (owner, caller(), future)
        return request_id

    def wait(self, request_id: str, timeout_s: float) -> Future | None:
        """The future once done, or None when still running after `timeout_s` (KeyError: unknown,
        or another tenant's)."""
        with self._lock:
            _, issued_to, future = self._futures[request_id]
        if not owns(issued_to):
            raise KeyError(request_id)
        try:
            future.exception(timeout=timeout_s)
        except FutureTimeout:
            return None
        return future

    def forget_owner(self, owner: str) -> None:
        """Drop the futures of a released model."""
        with self._lock:
            for request_id in [r for r, (o, _, _) in self._futures.items() if o == owner]:
                del self._futures[request_id]
