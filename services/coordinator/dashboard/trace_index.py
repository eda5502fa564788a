"""Per-step figures from a run's trace file, read incrementally (the file grows as the run goes).

Spans are written as they end, so a step's calls come before its root (rl_step/sft_step) span:
each call's time is added to its trace id, and when the root arrives the sums become the step's.
Only sums are kept, never the spans, so a long run's trace costs little memory here.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOTS = ("rl_step", "sft_step")
# Calls whose time the step timeline shows as dataloading (the coordinator's side of the call).
DATALOADING = ("rollway.dataloader.v1.DataloaderService/NextBatch",)


@dataclass
class StepTrace:
    step: int
    end: float  # seconds since the epoch: matched against the step's metrics record
    dataloading: float


@dataclass
class TraceIndex:
    path: Path
    offset: int = 0
    steps: list[StepTrace] = field(default_factory=list)
    _pending: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self) -> None:
        """Read what was appended since the last call (whole lines only)."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    if os.fstat(f.fileno()).st_size < self.offset:  # a new file at that path
                        self.offset, self.steps, self._pending = 0, [], {}
                    f.seek(self.offset)
                    data = f.read()
            except OSError:
                return
            complete = data[: data.rfind(b"\n") + 1]
            self.offset += len(complete)
            for line in complete.splitlines():
                try:
                    span = json.loads(line)
                except ValueError:
                    continue
                self._add(span)

    def _add(self, span: dict) -> None:
        trace_id = span.get("trace_id")
        if span.get("name") in DATALOADING and span.get("kind") == "CLIENT":
            seconds = (span["end_ns"] - span["start_ns"]) / 1e9
            self._pending[trace_id] = self._pending.get(trace_id, 0.0) + seconds
        elif span.get("name") in ROOTS and "step" in span.get("attributes", {}):
            dataloading = self._pending.pop(trace_id, 0.0)
            self.steps.append(StepTrace(span["attributes"]["step"], span["end_ns"] / 1e9, dataloading))

    def dataloading(self, step: int, record_time: float, tolerance: float = 60.0) -> float | None:
        """The dataloading seconds of the step whose metrics record was written at `record_time`
        (inside its root span: the root nearest that time), None when the trace has no such step."""
        with self._lock:
            candidates = [s for s in self.steps if s.step == step and abs(s.end - record_time) < tolerance]
        if not candidates:
            return None
        return min(candidates, key=lambda s: abs(s.end - record_time)).dataloading


_indexes: dict[Path, TraceIndex] = {}
_indexes_lock = threading.Lock()


def index_for(path: Path) -> TraceIndex:
    """The (shared, refreshed) index of a trace file."""
    with _indexes_lock:
        index = _indexes.setdefault(Path(path), TraceIndex(Path(path)))
    index.refresh()
    return index
