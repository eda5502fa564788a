"""One rank's background checkpoint write (async_save), as torchtitan does it with DCP.

    Save(async_save) command, ranks in step:   stage (copy state to memory) -> start -> return
    this rank's `checkpoint-write` thread:     write_staged over the checkpoint group -> done
    the next Save / Load / Shutdown:           wait() first (one write at a time per rank)

The write runs its collectives on a gloo group of its own, created once by every rank in the
same command, so that they never interleave with the training collectives of the default group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from rollway.trainer import checkpoint


@dataclass(frozen=True)
class WriteOutcome:
    """How a background write ended: `error` (path and errno) empty on success."""

    directory: Path
    error: str
    write_seconds: float


class BackgroundWriter:
    """Writes staged checkpoints in a thread; at most one write in flight."""

    def __init__(self, rank: int):
        self.rank = rank
        self.group: dist.ProcessGroup | None = None
        self.pending: Future[WriteOutcome] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-write")
        # What the thread runs; a test may wrap it (a write held open to be observed or killed).
        self.write: Callable[[checkpoint.Staged, Path, dist.ProcessGroup], None] = checkpoint.write_staged

    def start(self, staged: checkpoint.Staged, directory: Path) -> Future[WriteOutcome]:
        """Every rank, in step (the group is created collectively on the first call): begin
        writing `staged` into `directory`. The previous write must have been waited for."""
        if self.pending is not None and not self.pending.done():
            raise RuntimeError(f"a checkpoint write is still in flight: wait for it before {directory}")
        if self.group is None:
            self.group = dist.new_group(backend="gloo")
        self.pending = self._thread.submit(self._write, staged, directory)
        return self.pending

    def _write(self, staged: checkpoint.Staged, directory: Path) -> WriteOutcome:
        start = time.perf_counter()
        try:
            self.write(staged, directory, self.group)
        except Exception as exc:  # noqa: BLE001 - write_error re-raises what is not a write error
            error = f"rank {self.rank}: {checkpoint.write_error(exc, directory)}"
            return WriteOutcome(directory, error, time.perf_counter() - start)
        return WriteOutcome(directory, "", time.perf_counter() - start)

    def wait(self) -> WriteOutcome | None:
        """The outcome of the last write, once it ended (None if there was none)."""
        if self.pending is None:
            return None
        return self.pending.result()
