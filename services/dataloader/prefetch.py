"""Background tokenisation into a bounded buffer.

    NextBatch (RPC thread)                     prefetch thread
    take(n) --- want n ---> [ Condition ] <--- make_entry(): draw, read, tokenise
            <-- n entries -- deque of Entry <--- append while len < max(prefetch_size, want)

The producer keeps up to `prefetch_size` entries ready; while a request waits for more than
that, it produces up to the request's size, so prefetch_size 0 means "tokenise on request".
It stops after a terminal entry (end of stream, or an error), which is always the last in
the buffer. `take` removes entries only when it can return a whole batch, so a failed or
timed-out request consumes nothing and its retry sees the same entries.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from rollway.common.log import get_logger
from rollway.dataloader.items import Entry

log = get_logger(__name__)


class StreamError(Exception):
    """The next entries of the stream hold an error (a bad row): nothing can be served past it."""


class Prefetcher:
    """Runs `make_entry` on a background thread into a bounded buffer."""

    def __init__(self, make_entry: Callable[[], Entry], prefetch_size: int):
        self._make_entry = make_entry
        self._prefetch_size = prefetch_size
        self._buffer: deque[Entry] = deque()
        self._cond = threading.Condition()
        self._want = 0
        self._stopping = False
        self._done = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dataloader-prefetch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the producer (after the entry it is making) and drop the buffer."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._buffer.clear()

    @property
    def depth(self) -> int:
        """Items ready in the buffer (data/prefetch_queue_depth)."""
        with self._cond:
            return sum(1 for entry in self._buffer if not entry.terminal)

    def _has_room(self) -> bool:
        return len(self._buffer) < max(self._prefetch_size, self._want)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (self._done or not self._has_room()):
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                entry = self._make_entry()
            except Exception as exc:  # a bug, not bad data: report it instead of dying silently
                log.exception("prefetch failed")
                entry = Entry(
                    None, {}, error=f"internal error while preparing items: {type(exc).__name__}: {exc}"
                )
            with self._cond:
                if self._stopping:
                    return
                self._buffer.append(entry)
                self._done = entry.terminal
                if entry.terminal or len(self._buffer) >= self._want:
                    self._cond.notify_all()

    def _ready(self, n: int) -> int | None:
        """How many entries make the next batch, once they are buffered (None: not yet)."""
        if self._buffer and self._buffer[-1].terminal and len(self._buffer) <= n:
            if self._buffer[-1].error is not None:
                raise StreamError(self._buffer[-1].error)
            return len(self._buffer)
        return n if len(self._buffer) >= n else None

    def give_back(self, entries: list[Entry]) -> None:
        """Put entries returned by `take` back at the front, as if they had not been taken."""
        with self._cond:
            self._buffer.extendleft(reversed(entries))
            self._cond.notify_all()

    def take(self, n: int, timeout: float) -> list[Entry]:
        """The next n item entries, or fewer followed by the end entry when the stream ends.

        Raises StreamError when a bad row comes first, TimeoutError when the entries are not
        ready within `timeout` seconds; neither removes anything from the buffer.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._want = n
            self._cond.notify_all()
            try:
                while (count := self._ready(n)) is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(f"{n} items were not ready within {timeout:.1f}s")
                    self._cond.wait(remaining)
            finally:
                self._want = 0
            entries = [self._buffer.popleft() for _ in range(count)]
            self._cond.notify_all()
            return entries
