"""Where a run's metrics go: metrics.jsonl, TensorBoard, live subscribers and a console progress line.

Each record is one step: {"step": k, "time": unix, "<name>": value, ...} with Miles' metric names
(train/loss, rollout/raw_reward, perf/step_time, ...). StreamMetrics subscribers replay the file
and then follow new records.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from rollway.common.log import get_logger
from rollway.coordinator.step_pace import StepPace

log = get_logger("rollway.coordinator.metrics")


class TensorBoardWriter:
    """Scalars to a TensorBoard event file, with the tensorboard package only (no torch)."""

    def __init__(self, logdir: Path):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(str(logdir))

    def add_scalars(self, step: int, metrics: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items() if _finite(v)]
        self._writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


class MetricsSink:
    """Appends step records to RUN_DIR/metrics.jsonl and TensorBoard, and wakes subscribers."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = TensorBoardWriter(Path(run_dir) / "tensorboard") if tensorboard else None
        self._cond = threading.Condition()
        self._records: list[dict] = self.read(self.path)  # a resumed run appends to its history
        self._truncated_to: list[int] = []  # the number of records left by each truncate_from
        self.closed = False

    @staticmethod
    def read(path: Path) -> list[dict]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def log(self, step: int, metrics: dict[str, float]) -> dict:
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        with self._cond:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            self._records.append(record)
            self._cond.notify_all()
        if self._tb is not None:
            self._tb.add_scalars(step, metrics)
        return record

    def truncate_from(self, step: int) -> None:
        """Drop the records of steps >= `step`: a resumed run redoes them, and a redone step
        replaces its record instead of appearing twice in metrics.jsonl."""
        with self._cond:
            self._records = [r for r in self._records if r["step"] < step]
            self._truncated_to.append(len(self._records))  # followers past it go back (follow)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self._records))
            os.replace(tmp, self.path)

    @property
    def last(self) -> dict:
        with self._cond:
            return dict(self._records[-1]) if self._records else {}

    def follow(self, from_step: int = 0, stop: threading.Event | None = None) -> Iterator[dict]:
        """Records with step >= from_step, then new ones as they come, until close() or `stop`."""
        index, truncations = 0, len(self._truncated_to)
        while True:
            with self._cond:
                # A resume dropped records this follower had passed: the redone steps are appended
                # where they were, and must not be skipped as if already seen.
                index = min([index, *self._truncated_to[truncations:]])
                truncations = len(self._truncated_to)
                while index >= len(self._records) and not self.closed and not (stop and stop.is_set()):
                    self._cond.wait(0.5)
                    index = min([index, *self._truncated_to[truncations:]])
                    truncations = len(self._truncated_to)
                pending = self._records[index:]
                index = len(self._records)
                finished = self.closed or bool(stop and stop.is_set())
            yield from (r for r in pending if r["step"] >= from_step)
            if finished and index >= len(self._records):
                return

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        if self._tb is not None:
            self._tb.close()


# What the progress line shows, (label, metric) in order; the first present of each label's
# metrics is shown. RL shows its loss terms, not train/loss: with group-normalised advantages
# the on-policy policy loss is ~0 by construction, so a lone "loss 0.0000" said nothing.
RL_PROGRESS = (
    ("reward", "rollout/raw_reward"),
    ("pg_loss", "train/pg_loss"),
    ("kl_loss", "train/kl_loss"),
    ("entropy", "train/entropy_loss"),
    ("clipfrac", "train/pg_clipfrac"),
    ("grad_norm", "train/grad_norm"),
    ("acc", "eval/accuracy"),
)
SFT_PROGRESS = (
    ("reward", "rollout/raw_reward"),
    ("loss", "train/loss"),
    ("loss", "sft/loss"),
    ("acc", "eval/accuracy"),
)


def _number(value: float) -> str:
    """4 decimals, or 3 significant digits for small values (a tiny loss is not 0.0000)."""
    return f"{value:.4f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.3e}"


class ProgressLine:
    """One console line per step: step, reward, the losses (pg_loss, ... for RL), time per step, the
    eval's own time when the step began with one, ETA; and one line for the final evaluation.

    Time per step is wall time between the ends of recent steps with the evaluations taken out
    (step_pace.py), so checkpoint saves and recoveries between steps are in it, and the ETA adds
    the evaluations still to come at their own pace. Each record is timed by its own `time` (when
    the run wrote it): a resumed run's stream replays its earlier steps at once, and those written
    before `since` (this attempt's start, on the clock that stamps the records) are an earlier
    attempt's: not shown, and not in the pace."""

    def __init__(self, total_steps: int, stream=None, since: float = 0.0, eval_interval: int = 0):
        self.total = total_steps
        self.stream = stream or sys.stdout
        self.since = since
        self.started = since or time.time()
        self.pace = StepPace(total_steps, since=since, eval_interval=eval_interval)
        self.first_step: int | None = None  # this attempt's first step (counting from 1)

    def update(self, step: int, metrics: dict[str, float], at: float | None = None) -> str | None:
        """`step` counts from 1 (the line shows "step 3/10" once the third has ended); `at`: the
        record's unix time (now when not given). None, printing nothing, for an earlier attempt's."""
        at = time.time() if at is None else at
        if at < self.since:
            return None
        if "perf/step_time" not in metrics and "perf/eval_time" in metrics:
            return self._print(self._final_eval(step, metrics))
        self.pace.add(step - 1, at, metrics)
        if self.first_step is None:
            self.first_step = step
        per_step, remaining = self.pace.seconds_per_step, self.pace.eta_seconds()
        if per_step is None:  # one step and no timer of its own: the clock since the attempt began
            per_step = max(at - self.started, 0.0) / max(step - self.first_step + 1, 1)
        if remaining is None:
            remaining = max(self.total - step, 0) * per_step
        parts = [f"step {step}/{self.total}" if self.total else f"step {step}", *self._shown(metrics)]
        parts.append(f"{per_step:.2f} s/step")
        if "perf/eval_time" in metrics:
            parts.append(f"eval {metrics['perf/eval_time']:.1f} s")
        parts.append(f"ETA {_hms(remaining)}")
        return self._print(" | ".join(parts))

    @staticmethod
    def _final_eval(step: int, metrics: dict[str, float]) -> str:
        """The record the run logs after its last step (step num_steps + 1 counted from 1): named
        for the step it follows, never as a step of this attempt's total (a run extended with
        --resume has more steps than the run that evaluated)."""
        return " | ".join(
            [
                f"final eval after step {step - 1}",
                *ProgressLine._shown(metrics),
                f"eval {metrics['perf/eval_time']:.1f} s",
            ]
        )

    @staticmethod
    def _shown(metrics: dict[str, float]) -> list[str]:
        parts, shown = [], set()
        for label, key in RL_PROGRESS if "train/pg_loss" in metrics else SFT_PROGRESS:
            if key in metrics and label not in shown:
                shown.add(label)
                parts.append(f"{label} {_number(metrics[key])}")
        return parts

    def _print(self, line: str) -> str:
        print(line, file=self.stream, flush=True)
        return line


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
