"""Admission of Generate calls: a bounded number generate at once, a bounded number wait.

    Generate ──> a running slot free (and nobody queued)? ──yes──> generate; the slot is held
        │ no                                                      until the stream ends
        v
    queue full? ──yes──> RESOURCE_EXHAUSTED (names --generate-queue-size)
        │ no
        v
    wait in FIFO order ──> a slot is handed over: generate
        ├── waited --generate-queue-timeout: DEADLINE_EXCEEDED
        ├── the client cancelled (or its deadline passed): leaves the queue
        └── the service drains (SIGTERM): UNAVAILABLE

Each call, running or queued, holds one server thread (the gRPC server is synchronous), so the
service's thread pool is sized to hold every running and queued call plus CONTROL_THREADS for
Pause, Resume, GetInfo and the weight-sync RPCs: a full house never blocks a Resume.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rollway.common.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from rollway.common.log import get_logger

log = get_logger("rollway.rollout.queue")

CONTROL_THREADS = 4  # server threads kept free of Generate calls
POLL_SECONDS = 0.5  # a queued call re-checks its client this often (cancellation also wakes it)
SHUTTING_DOWN = "the rollout service is shutting down; send the call to another rollout service or retry"


@dataclass(eq=False)
class _Waiter:
    wake: threading.Event = field(default_factory=threading.Event)
    admitted: bool = False


class GenerateQueue:
    """Running slots for Generate calls and the bounded FIFO queue in front of them."""

    def __init__(self, max_running: int, max_queued: int, timeout: float):
        self.max_running = max_running
        self.max_queued = max_queued
        self.timeout = timeout
        self._lock = threading.Lock()
        self._waiters: deque[_Waiter] = deque()
        self._num_running = 0
        self._closed = False

    @staticmethod
    def num_threads(max_running: int, max_queued: int) -> int:
        """Server threads needed to hold every running and queued call and still serve control RPCs."""
        return max_running + max_queued + CONTROL_THREADS

    @property
    def num_running(self) -> int:
        with self._lock:
            return self._num_running

    @property
    def num_queued(self) -> int:
        with self._lock:
            return len(self._waiters)

    @property
    def closed(self) -> bool:
        return self._closed

    @contextmanager
    def slot(
        self, is_active: Callable[[], bool], on_cancel: Callable[[Callable[[], None]], object]
    ) -> Iterator[bool]:
        """Hold a running slot for the body; yields False (holding none) if the client went away
        while queued. Raises RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED or UNAVAILABLE (see module doc)."""
        admitted = self._acquire(is_active, on_cancel)
        try:
            yield admitted
        finally:
            if admitted:
                self._release()

    def close(self) -> None:
        """Refuse new calls and end the queued ones (UNAVAILABLE); running calls keep their slots."""
        with self._lock:
            self._closed = True
            waiters = list(self._waiters)
        for waiter in waiters:
            waiter.wake.set()

    def _acquire(self, is_active, on_cancel) -> bool:
        with self._lock:
            if self._closed:
                raise Unavailable(SHUTTING_DOWN)
            if self._num_running < self.max_running and not self._waiters:
                self._num_running += 1
                return True
            if len(self._waiters) >= self.max_queued:
                raise ResourceExhausted(
                    f"{self._num_running} Generate calls are running (--max-generate-calls "
                    f"{self.max_running}) and {len(self._waiters)} are queued (--generate-queue-size "
                    f"{self.max_queued}); retry later"
                )
            waiter = _Waiter()
            self._waiters.append(waiter)
        on_cancel(waiter.wake.set)  # a cancelled client wakes its waiter at once
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            waiter.wake.wait(max(0.0, min(remaining, POLL_SECONDS)))
            waiter.wake.clear()  # before looking: a hand-over after this sets it again
            with self._lock:
                if waiter.admitted:
                    return True
                closed = self._closed
            if closed or not is_active() or time.monotonic() >= deadline:
                if self._leave(waiter):
                    return True  # a slot was handed over meanwhile: use it (or the caller ends it)
                if closed:
                    raise Unavailable(SHUTTING_DOWN)
                if not is_active():
                    return False
                raise DeadlineExceeded(
                    f"waited {self.timeout:g} s in the Generate queue for a running slot "
                    f"(--generate-queue-timeout); {self.max_running} calls were running"
                )

    def _leave(self, waiter: _Waiter) -> bool:
        """Take `waiter` out of the queue; True if it was admitted first (it then holds a slot)."""
        with self._lock:
            if waiter.admitted:
                return True
            self._waiters.remove(waiter)
            return False

    def _release(self) -> None:
        with self._lock:
            if self._waiters:
                waiter = self._waiters.popleft()
                waiter.admitted = True  # the slot passes straight to the head of the queue
                waiter.wake.set()
                return
            self._num_running -= 1
