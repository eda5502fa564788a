"""Which prompts each step used, by dataset position: RUN_DIR/prompts.jsonl.

One record per step, {"step": k, "prompts": [[source, epoch, row_index], ...]}, in the order the
dataloader served them (RL: every prompt fetched for the rollout, dropped groups included; SFT:
the step's conversations). A run resumed from a checkpoint at step k (after a crash or a
recovery) first drops the records of steps >= k, so the file always holds each step once, and
across any number of recoveries every prompt appears once per epoch (tests check that).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

Position = tuple[str, int, int]  # (source, epoch, row_index)


class PromptLedger:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "prompts.jsonl"

    def record(self, step: int, prompts: Iterable[Position]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "prompts": [list(p) for p in prompts]}) + "\n")

    def truncate_from(self, step: int) -> None:
        """Forget the records of steps >= `step` (they are about to be redone)."""
        kept = [r for r in self.read_records(self.path) if r["step"] < step]
        _rewrite(self.path, kept)

    @staticmethod
    def read_records(path: Path) -> list[dict]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    @classmethod
    def by_step(cls, run_dir: Path) -> dict[int, list[Position]]:
        return {
            r["step"]: [tuple(p) for p in r["prompts"]]
            for r in cls.read_records(Path(run_dir) / "prompts.jsonl")
        }


def _rewrite(path: Path, records: list[dict]) -> None:
    if not path.exists():
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)
