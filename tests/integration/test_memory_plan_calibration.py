"""The memory plan against a real trainer service: `python -m bench.bench_memory_plan --quick`
starts `python -m rollway.trainer` on the tiny and the small (~50.6M) presets, trains two steps of
512 tokens over gRPC and compares the process's peak RSS (VmHWM) with `rollway plan`'s trainer-rank
peak. The 0.3-0.6B shapes (the issue's 15%) are `make bench`'s: too big for the test suite.

At ~50M parameters the fixed runtime (Python, torch, transformers, gRPC: ~0.4 GiB) is a fifth of
the peak, and the step-transient coefficient fitted on the 12-layer cut (7 bytes per parameter)
is ~0.8 byte below the small preset's own, so the plan under-predicts it. The peak RSS itself moves
between runs with the allocator's fragmentation: the small preset measured -1.5%, -5.8% and (CI,
2026-11-28) -10.2% on the same tree. SMALL_TOLERANCE is the issue's 15%: a bound on the plan, not on
the allocator's luck.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# |predicted - measured| / measured. Measured: small -1.5% and -5.8% here, -10.2% on CI; tiny +1.7%
# to +2.2%. The tiny preset is the runtime alone, whose size moves with torch and transformers.
SMALL_TOLERANCE = 0.15
TINY_TOLERANCE = 0.15


def test_quick_bench_predicts_the_small_presets_peak_within_tolerance(tmp_path):
    env = {"ROLLWAY_MEMORY_PLAN_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:  # a worktree's checkout over the installed package
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
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
