"""The memory plan against a real trainer service: `python -m bench.bench_memory_plan --quick`
starts `python -m rollway.trainer` on the tiny and the small (~50.6M) presets, trains two steps of
512 tokens over gRPC and compares the process's peak RSS (VmHWM) with `rollway plan`'s trainer-rank
peak. The 0.3-0.6B shapes (the issue's 15%) are `make bench`'s: too big for the test suite.

At ~50M parameters the fixed runtime (Python, torch, transformers, gRPC: ~0.45 GiB) is a third of
the peak, and the allocator's slack around the weights varies by a few hundred MiB from run to run,
so the bound here is looser than the 15% of the large shapes: SMALL_TOLERANCE.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# |predicted - measured| / measured for the small preset (measured -3% to +6% on this machine
# after calibration; docs/performance.md's table); the tiny preset is runtime only: TINY_TOLERANCE.
SMALL_TOLERANCE = 0.20
TINY_TOLERANCE = 0.30


def test_quick_bench_predicts_the_small_presets_peak_within_tolerance(tmp_path):
    env = {"ROLLWAY_MEMORY_PLAN_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_memory_plan", "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    rows = {row["shape"]: row for row in map(json.loads, lines)}
    assert set(rows) == {"tiny", "small"}, done.stdout
    small, tiny = rows["small"], rows["tiny"]
    assert small["measured_gib"] > 1.0, small  # the trainer really loaded ~50M parameters and trained
    assert abs(small["error_pct"]) <= 100 * SMALL_TOLERANCE, small
    assert abs(tiny["error_pct"]) <= 100 * TINY_TOLERANCE, tiny
