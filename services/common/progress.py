"""A service's progress on its long calls, served to the coordinator's hang watch.

    work loops:        progress.beat()          a micro-batch, a decode step, a weight bucket done
    ProgressInterceptor: watched calls in flight (start, streamed replies count as beats, end)
    ProgressServicer:  GetProgress -> pid, each watched call's running and silent seconds, and
                       the median duration of recent calls per method

A crash is seen by the process ending; a hang is not. A frozen process (SIGSTOP, a stuck kernel)
answers nothing, and a deadlocked thread leaves the gRPC threads answering while its call goes
quiet. The coordinator asks GetProgress (coordinator/watch.py) and tells both apart from a
slow step: silence longer than the call's usual duration many times over.

One clock per process: any progress counts for every call in flight (a step's micro-batches keep
its TrainStep alive, whichever thread computes them).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from rollway.common.interceptors import wrap_handler
from rollway.common.v1 import progress_pb2, progress_pb2_grpc

RECENT_CALLS = 20  # completed calls per method the median is taken over


@dataclass
class _Call:
    method: str
    started: float


class ProgressClock:
    """When this process last made progress, and which watched calls are in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_beat = time.monotonic()
        self._calls: dict[int, _Call] = {}
        self._next_id = 0
        self._durations: dict[str, deque[float]] = {}

    def beat(self) -> None:
        self._last_beat = time.monotonic()  # one float store: no lock on the hot path

    def call_started(self, method: str) -> int:
        with self._lock:
            self._next_id += 1
            self._calls[self._next_id] = _Call(method, time.monotonic())
            return self._next_id

    def call_ended(self, call_id: int, completed: bool) -> None:
        """A call left; one that completed (not failed, not cancelled) counts towards its median."""
        with self._lock:
            call = self._calls.pop(call_id, None)
            if call is not None and completed:
                durations = self._durations.setdefault(call.method, deque(maxlen=RECENT_CALLS))
                durations.append(time.monotonic() - call.started)

    def snapshot(self) -> progress_pb2.GetProgressResponse:
        now = time.monotonic()
        with self._lock:
            calls = sorted(self._calls.values(), key=lambda c: c.started)
            medians = {m: statistics.median(d) for m, d in self._durations.items() if d}
        last_beat = self._last_beat
        return progress_pb2.GetProgressResponse(
            pid=os.getpid(),
            calls=[
                progress_pb2.CallProgress(
                    method=c.method,
                    running_seconds=now - c.started,
                    silent_seconds=now - max(c.started, last_beat),
                )
                for c in calls
            ],
            median_seconds=medians,
        )


CLOCK = ProgressClock()


def beat() -> None:
    """This process made progress on its work (call it from loops: per micro-batch, per token)."""
    CLOCK.beat()


class ProgressInterceptor(grpc.ServerInterceptor):
    """Tracks the calls of `watched` methods (short names, e.g. "TrainStep") on CLOCK."""

    def __init__(self, watched: Iterable[str], clock: ProgressClock = CLOCK):
        self.watched = frozenset(watched)
        self.clock = clock

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if method not in self.watched:
            return handler
        clock = self.clock

        def track(behaviour: Callable, req_stream: bool, resp_stream: bool) -> Callable:
            if resp_stream:

                def stream(request, context) -> Iterator[Any]:
                    call_id = clock.call_started(method)
                    completed = False
                    try:
                        for reply in behaviour(request, context):
                            clock.beat()  # a streamed reply is progress
                            yield reply
                        completed = True
                    finally:
                        clock.call_ended(call_id, completed)

                return stream

            def unary(request, context):
                call_id = clock.call_started(method)
                completed = False
                try:
                    reply = behaviour(request, context)
                    completed = True
                    return reply
                finally:
                    clock.call_ended(call_id, completed)

            return unary

        return wrap_handler(handler, track)


class ProgressServicer(progress_pb2_grpc.ProgressServiceServicer):
    def __init__(self, clock: ProgressClock = CLOCK):
        self.clock = clock

    def GetProgress(self, request, context):
        return self.clock.snapshot()
