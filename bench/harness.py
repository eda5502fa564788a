"""Benchmark harness: `python -m bench.run` (what `make bench` calls).

A benchmark is a module bench/bench_<name>.py with a function

    def run(quick: bool) -> BenchResult

`quick` asks for a smaller configuration (CI smoke runs). The harness times nothing itself: each
benchmark measures what it reports. It adds the machine, commit and time, writes
bench/results/<name>.json and prints one table row per configuration.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass
class BenchResult:
    """What one benchmark measured.

    rows: one dict per configuration, e.g. {"variant": "packed", "ranks": 2, "tokens_per_s": 1234.5}.
    units: unit of each figure in the rows, e.g. {"tokens_per_s": "tokens/s"}.
    config: settings shared by every row (model size, dataset size, ...).
    summary: figures over all rows (totals, pass/fail checks), printed under the table.
    """

    name: str
    rows: list[dict[str, Any]]
    units: dict[str, str]
    config: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)  # headline figures, written at the top level


def machine_info() -> dict[str, Any]:
    """Facts that make results comparable across commits and machines."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    try:
        info["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return info


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def write_result(result: BenchResult, seconds: float) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    fields = asdict(result)
    payload = {
        **fields.pop("summary"),
        **fields,
        "machine": machine_info(),
        "commit": git_commit(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "benchmark_seconds": round(seconds, 2),
    }
    path = RESULTS_DIR / f"{result.name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def format_table(result: BenchResult) -> str:
    """A plain-text table of the rows, figures with their units in the header."""
    columns: list[str] = []
    for row in result.rows:
        columns += [c for c in row if c not in columns]
    header = [f"{c} ({result.units[c]})" if c in result.units else c for c in columns]
    cells = [[_fmt(row.get(c, "")) for c in columns] for row in result.rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = [f"== {result.name}" + (f": {result.notes}" if result.notes else "")]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines += [f"{key}: {_fmt(value)}" for key, value in result.summary.items()]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)
