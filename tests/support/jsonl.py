"""JSON Lines in tests: the datasets a test writes, and the metrics.jsonl a run writes."""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: Path, rows: list[dict]) -> str:
    """One JSON object a line; the path as a string (what a config takes)."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def read_metrics(run_dir: Path) -> list[dict]:
    """A run's metrics records, one a step, from its run directory."""
    return read_jsonl(run_dir / "metrics.jsonl")
