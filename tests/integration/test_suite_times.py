"""bench/suite_times.py reads the JUnit report `make test` writes (pytest run with the Makefile's
flags on a small suite of its own) and turns it into the per-file and top-test tables."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from bench.suite_times import CaseTime, SuiteTimes, format_report, per_file, read_junit

SMALL_SUITE = {
    "test_alpha.py": """
import time

import pytest

def test_passes():
    time.sleep(0.05)  # its measured duration is what the report must carry (not a wait on anything)
    assert 1 + 1 == 2

def test_fails():
    assert 1 + 1 == 3

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
""",
    "test_beta.py": """
import pytest

@pytest.mark.parametrize("n", [1, 2])
def test_each(n):
    assert n > 0
""",
}


def test_a_small_pytest_run_becomes_a_table_per_file_with_its_counts(tmp_path):
    for name, source in SMALL_SUITE.items():
        (tmp_path / name).write_text(source)
    report = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # this suite's options only
    # The flags `make test` passes (the Makefile's test recipe).
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
         "-o", "junit_family=xunit1", "test_alpha.py", "test_beta.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr  # test_fails failed, as it should

    times = read_junit(str(report))
    assert sorted((t.file, t.name, t.outcome) for t in times.tests) == [
        ("test_alpha.py", "test_fails", "failed"),
        ("test_alpha.py", "test_passes", "passed"),
        ("test_alpha.py", "test_skipped", "skipped"),
        ("test_beta.py", "test_each[1]", "passed"),
        ("test_beta.py", "test_each[2]", "passed"),
    ]
    passes = next(t for t in times.tests if t.name == "test_passes")
    assert times.suite_seconds >= sum(t.seconds for t in times.tests) >= passes.seconds >= 0.05

    table = format_report(times, set_up_seconds=60.0)
    rows = {
        m[1]: (int(m[2]), int(m[3]))
        for m in re.finditer(r"^\| (test_\w+\.py) \| (\d+) \| (\d+) \|", table, re.M)
    }
    assert rows == {"test_alpha.py": (3, 1), "test_beta.py": (2, 0)}
    assert "5 tests (1 failed, 3 passed, 1 skipped)" in table
    assert "set-up before it 1.0 min (60 s)" in table
    assert table.count("| test_") == 2 + 5  # a row per file, then each test (fewer than the top 20)


def test_files_and_tests_are_ordered_by_their_cost():
    tests = [
        CaseTime("tests/a.py", "test_quick", 1.0, "passed"),
        CaseTime("tests/b.py", "test_long", 30.0, "passed"),
        CaseTime("tests/a.py", "test_middle", 12.0, "passed"),
        CaseTime("tests/c.py", "test_skip", 0.0, "skipped"),
    ]
    assert per_file(tests) == [
        ("tests/b.py", 30.0, 1, 0),
        ("tests/a.py", 13.0, 2, 0),
        ("tests/c.py", 0.0, 1, 1),
    ]
    table = format_report(SuiteTimes(tests, suite_seconds=50.0, timestamp="2026-11-28T04:00:00"), top=2)
    assert "## Test suite times (2026-11-28)" in table
    assert "| tests/b.py | 1 | 0 | 30.0 | 60.0% |" in table
    assert "| (outside tests: collection, imports) | | | 7.0 | 14.0% |" in table
    top = table.split("Top 2 tests:")[1]
    assert re.findall(r"^\| (\S+::\S+) \|", top, re.M) == ["tests/b.py::test_long", "tests/a.py::test_middle"]


def test_the_report_of_parallel_workers_shares_out_their_time_together():
    tests = [
        CaseTime("tests/a.py", "test_a", 30.0, "passed"),
        CaseTime("tests/b.py", "test_b", 40.0, "passed"),
    ]
    table = format_report(SuiteTimes(tests, suite_seconds=50.0, timestamp=""), workers=2)
    assert "on 2 workers, 1.2 min (70 s) of test time" in table
    assert "| tests/b.py | 1 | 0 | 40.0 | 40.0% |" in table  # of the 100 s the two workers had
    assert "| (outside tests: collection, imports, a worker idle) | | | 30.0 | 30.0% |" in table
