"""make test's parallel workers (pytest-xdist with tests/support/workers.py's scheduler) on a small
suite of their own: each group's tests run on one worker, in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parents[1]
RECORD = """
import os
import subprocess
import sys
from pathlib import Path

def record(name):
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True, check=True).stdout.replace(" ", "")
    with open(Path(__file__).parent / "ran.txt", "a") as f:
        f.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']} {child}")
"""
CONFTEST = """
from support.workers import make_scheduler, pin_to_own_cores

def pytest_configure(config):
    pin_to_own_cores()

def pytest_xdist_make_scheduler(config, log):
    return make_scheduler(config, log)
"""


def module(*names: str) -> str:
    return "from record import record\n" + "".join(f"\ndef test_{n}():\n    record('{n}')\n" for n in names)


def test_each_group_runs_on_one_worker_in_order_on_its_own_cores(tmp_path):
    (tmp_path / "record.py").write_text(RECORD)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_alpha.py").write_text(module("a1", "a2", "a3"))
    (tmp_path / "test_beta.py").write_text(module("b1", "b2", "b3"))
    (tmp_path / "test_ray_gamma.py").write_text(module("r1", "r2"))
    (tmp_path / "test_delta_ray.py").write_text(module("r3", "r4"))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(TESTS)])
    # The flags `make test` passes (the Makefile's TEST_WORKERS_FLAGS).
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--no-loadscope-reorder",
         "test_alpha.py", "test_beta.py", "test_delta_ray.py", "test_ray_gamma.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [line.split() for line in (tmp_path / "ran.txt").read_text().splitlines()]
    assert sorted(name for name, _, _ in ran) == ["a1", "a2", "a3", "b1", "b2", "b3", "r1", "r2", "r3", "r4"]
    worker = {name: gw for name, gw, _ in ran}
    assert {worker["a1"], worker["a2"], worker["a3"]} == {worker["a1"]}
    assert {worker["b1"], worker["b2"], worker["b3"]} == {worker["b1"]}
    assert {worker[f"r{i}"] for i in range(1, 5)} == {worker["r1"]}  # both Ray modules: one worker
    assert {worker["a1"], worker["b1"], worker["r1"]} == {"gw0", "gw1"}  # both workers had work
    for group in (["a1", "a2", "a3"], ["r3", "r4", "r1", "r2"]):  # collection order within a group
        assert [name for name, _, _ in ran if name in group] == group
    # Each worker's processes (a child of the test here) run on its own half of the cores.
    cores = {gw: {cpus for _, g, cpus in ran if g == gw} for gw in ("gw0", "gw1")}
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) >= 2:
        assert cores == {
            "gw0": {str(usable[0::2]).replace(" ", "")},
            "gw1": {str(usable[1::2]).replace(" ", "")},
        }
