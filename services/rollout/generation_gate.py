"""Pause and resume: which Generate calls may reach the engine, and when.

Decision: a Generate call that arrives while generation is paused WAITS until Resume (or until
its own deadline, or the client cancels); it is not refused. This is what the coordinator's
weight-sync sequence (pause, load, resume) wants: generation requests issued concurrently just
start later, on the new weights.

Pause(ABORT) aborts every unfinished sample of the calls already admitted (they stream back
with FINISH_REASON_ABORT). Pause(WAIT) lets admitted calls finish generating, then returns.
Submission and abort happen under one lock, so no call slips into the engine after a pause.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from rollway.common.errors import DeadlineExceeded

T = TypeVar("T")


class GenerationGate:
    """Paused flag plus the number of admitted calls whose samples are still generating."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.paused = False
        self.num_generating = 0

    def admit(self, submit: Callable[[], T], is_active: Callable[[], bool]) -> T | None:
        """Wait while paused, then run `submit` (queue the samples). None if the caller went away."""
        with self._cond:
            while self.paused:
                if not is_active():
                    return None
                self._cond.wait(0.25)
            handle = submit()
            self.num_generating += 1
            return handle

    def release(self) -> None:
        """An admitted call has all its samples back from the engine."""
        with self._cond:
            self.num_generating -= 1
            self._cond.notify_all()

    def pause_abort(self, abort_all: Callable[[], int]) -> int:
        """Pause and abort everything admitted; returns the number of samples aborted."""
        with self._cond:
            self.paused = True
            return abort_all()

    def pause_wait(self, timeout: float | None) -> None:
        """Pause and wait until admitted calls have finished generating."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self.paused = True
            while self.num_generating > 0:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise DeadlineExceeded(
                        f"{self.num_generating} Generate calls still running; generation stays paused"
                    )
                self._cond.wait(remaining if remaining is not None else 1.0)

    def resume(self) -> None:
        with self._cond:
            self.paused = False
            self._cond.notify_all()

    def run_if_idle(self, action: Callable[[], T], busy: Callable[[], Exception]) -> T:
        """Run `action` with no call generating and none admitted meanwhile; else raise busy()."""
        with self._cond:
            if self.num_generating > 0:
                raise busy()
            return action()
