"""Runs on disk are the source of truth: what a coordinator (maybe a restarted one) knows of a
run it is not driving, read from the files the run wrote (dashboard/run_files.py lists them).

A run directory with no status.json was running when its coordinator stopped: it is reported
FAILED with that cause (StartRun with `resume: true` continues it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rollway.coordinator.dashboard import run_files

INTERRUPTED = "the coordinator stopped while the run was going on; StartRun with resume: true continues it"


@dataclass
class PastRun:
    """A run read back from its directory."""

    run_id: str
    run_dir: Path
    state: str
    error: str
    step: int
    num_steps: int
    created: float
    finished: float
    started: float = 0.0
    last_metrics: dict[str, float] = field(default_factory=dict)
    checkpoint_dir: str = ""
    hf_export_dir: str = ""
    num_restarts: int = 0
    config: dict = field(default_factory=dict)


def is_run_dir(path: Path) -> bool:
    """A folder a run wrote (StartRun writes config.json first)."""
    return (path / "config.json").is_file()


def read_run(run_dir: Path) -> PastRun:
    """The run in `run_dir`, as far as its files tell."""
    config = run_files.read_json(run_dir / "config.json")
    # A status.json with no state is the one reserved at the start (run_files.reserve_status):
    # the run was going on.
    status = run_files.read_json(run_dir / run_files.STATUS_FILE)
    if not status.get("state"):
        status = {}
    result = run_files.read_json(run_dir / "result.json")
    steps = [r for r in _records(run_dir) if "perf/step_time" in r]  # training steps, not eval-only
    last = dict(steps[-1]) if steps else {}
    final_eval = result.get("final_metrics") or {}
    last.update({k: v for k, v in final_eval.items() if k.startswith("eval/")})
    coordinator = config.get("coordinator") or {}
    return PastRun(
        run_id=run_dir.name,
        run_dir=run_dir,
        state=status.get("state") or "FAILED",
        error=status.get("error", "") if status else INTERRUPTED,
        step=(int(steps[-1]["step"]) + 1) if steps else 0,
        num_steps=int((config.get("plan") or {}).get("num_steps", coordinator.get("num_rollout", 0)) or 0),
        created=float((config.get("plan") or {}).get("created", _mtime(run_dir / "config.json"))),
        started=float(run_files.read_json(run_dir / run_files.STARTED_FILE).get("time", 0.0)),
        # An interrupted run (no state recorded) ended with the last thing it wrote.
        finished=float(status["time"]) if status else _last_written(run_dir),
        last_metrics={k: float(v) for k, v in last.items() if k not in ("step", "time") and _number(v)},
        checkpoint_dir=result.get("checkpoint_dir", ""),
        hf_export_dir=result.get("hf_export_dir", ""),
        num_restarts=int(result.get("num_restarts", 0)),
        config=config,
    )


def read_runs(root: Path) -> list[PastRun]:
    """Every run under a runs root."""
    root = Path(root)
    if not root.is_dir():
        return []
    return [read_run(path) for path in sorted(root.iterdir()) if path.is_dir() and is_run_dir(path)]


def _records(run_dir: Path) -> list[dict]:
    records, _ = run_files.read_metrics(run_dir)
    return records


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _last_written(run_dir: Path) -> float:
    return max(_mtime(run_dir / name) for name in ("config.json", "metrics.jsonl", run_files.STARTED_FILE))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
