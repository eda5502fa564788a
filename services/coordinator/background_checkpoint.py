"""A run checkpoint completed in the background (async_save): the step goes on meanwhile.

    step k, main thread:    state + cursor snapshot -> trainer.SaveCheckpoint(async_save)
                            (returns once the trainer staged its state) -> start() -> next step
    `run-checkpoint` thread: trainer.WaitCheckpoint (the write is complete)
                            -> complete(): coordinator.json, manifest, latest pointer, rotation
    the next save, the end of the run:  finish() waits for it first (one in flight at most)

The run checkpoint becomes complete (coordinator.json) only after the trainer's write is, so a
crash mid-write leaves a directory that resume never picks. After `abandon()` (the run attempt
ended, e.g. a service died and a recovery takes over) a write that still finishes completes
nothing: the recovery's resume has already chosen its checkpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rollway.common.tracing import in_current_context
from rollway.trainer.v1 import trainer_pb2


@dataclass(frozen=True)
class Completed:
    """A run checkpoint completed in the background, and how long the trainer's write took."""

    directory: Path
    write_seconds: float


class BackgroundCheckpoint:
    """At most one run checkpoint in flight; `finish` hands over its outcome (or its error)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.directory: Path | None = None  # of the checkpoint in flight (or last finished)
        self._pending: Future[Completed | None] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="run-checkpoint")
        self._lock = threading.Lock()
        self._abandoned = False

    def start(self, directory: Path, trainer_dir: str, complete: Callable[[], None]) -> None:
        """Complete `directory` with `complete()` once the trainer's `trainer_dir` is written."""
        if self._pending is not None:
            raise RuntimeError(f"run checkpoint {self.directory} still in flight: finish() it first")
        self.directory = directory
        self._pending = self._thread.submit(
            in_current_context(self._complete), directory, trainer_dir, complete
        )

    def _complete(self, directory: Path, trainer_dir: str, complete: Callable[[], None]) -> Completed | None:
        reply = self.trainer.WaitCheckpoint(trainer_pb2.WaitCheckpointRequest(checkpoint_dir=trainer_dir))
        with self._lock:
            if self._abandoned:
                return None
            complete()
        return Completed(directory, reply.write_seconds)

    def finish(self) -> Completed | None:
        """Wait for the checkpoint in flight; None when there is none. Raises what it raised
        (a trainer's RESOURCE_EXHAUSTED for a full disk, the coordinator's OSError)."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def abandon(self) -> None:
        """From now on a write that finishes completes no run checkpoint; does not wait."""
        with self._lock:
            self._abandoned = True
        self._thread.shutdown(wait=False)
