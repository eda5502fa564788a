"""The demo's claim, measured: GRPO lifts held-out accuracy of the SFT model on seeds 0, 1 and 2.

What runs: `rollway demo --seed S` as a real process (what `make run` runs, shipped settings),
once per seed; each writes summary.json, whose figures are the rows.

Rows: one per seed:
    seed, accuracy_before_rl, accuracy_after_rl, lift    held-out (greedy, exact match) accuracy
                                                         of the SFT model and of the GRPO model
    sft_steps, rl_steps, wall_s                          SFT steps the stopping rule chose, GRPO
                                                         rollouts, the demo's own wall time (set-up
                                                         included)
Summary:
    min_lift, max_wall_s       docs/demo.md quotes these; the goal is a lift >= 0.2 on every seed
    all_seeds_lift_0_2         min_lift >= 0.2

--quick runs seed 0 with 20 SFT steps and 2 rollouts: a smoke run of the path, not of the claim.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import BenchResult

SEEDS = (0, 1, 2)
GOAL_LIFT = 0.2


def demo_summary(workdir: Path, seed: int, extra: list[str]) -> dict:
    """Run `rollway demo` once in a process of its own; its summary.json."""
    command = [sys.executable, "-m", "rollway.cli", "demo", "--workdir", str(workdir), "--seed", str(seed)]
    result = subprocess.run(command + extra, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(
            f"rollway demo --seed {seed} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    (demo_dir,) = workdir.iterdir()
    return json.loads((demo_dir / "summary.json").read_text())


def run(quick: bool) -> BenchResult:
    seeds, extra = ((0,), ["--sft-steps", "20", "--rl-steps", "2"]) if quick else (SEEDS, [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        for seed in seeds:
            summary = demo_summary(Path(tmp) / f"seed{seed}", seed, extra)
            before, after = summary["accuracy_before_rl"], summary["accuracy_after_rl"]
            rows.append(
                {
                    "seed": seed,
                    "accuracy_before_rl": before,
                    "accuracy_after_rl": after,
                    "lift": round(after - before, 4),
                    "sft_steps": summary["sft_steps"],
                    "rl_steps": summary["rl_steps"],
                    "wall_s": summary["wall_seconds"],
                }
            )
    min_lift = min(row["lift"] for row in rows)
    return BenchResult(
        name="demo",
        rows=rows,
        units={"wall_s": "s"},
        config={"seeds": list(seeds), "command": "rollway demo --seed S" + "".join(f" {a}" for a in extra)},
        summary={
            "min_lift": min_lift,
            "max_wall_s": max(row["wall_s"] for row in rows),
            f"all_seeds_lift_{GOAL_LIFT}": min_lift >= GOAL_LIFT,
        },
        notes="held-out accuracy before -> after GRPO, shipped demo settings",
    )
