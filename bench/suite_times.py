"""Where the test suite's minutes go: a markdown table per test file and the costliest tests.

python -m bench.suite_times JUNIT_XML [--set-up-seconds N] [--workers W] [--top 20] > times.md

JUNIT_XML is pytest's `--junitxml` report with `-o junit_family=xunit1` (each test case names its
file), as `make test` writes it. A test's seconds are its set-up, call and tear-down together, so a
module's shared services are charged to the test that started them. With W parallel workers the
suite has W times its wall time to spend: shares are of that, and what no test spent (collection,
imports, the session's end, a worker waiting for the last group of another) is a row of its own.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class CaseTime:
    file: str
    name: str
    seconds: float
    outcome: str  # passed, failed, error or skipped


@dataclass(frozen=True)
class SuiteTimes:
    tests: list[CaseTime]
    suite_seconds: float  # pytest's own wall time for the session
    timestamp: str


def read_junit(path: str) -> SuiteTimes:
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = []
    for case in root.iter("testcase"):
        if "file" not in case.attrib:
            raise ValueError(f"{path}: test cases without a file: run pytest with -o junit_family=xunit1")
        tests.append(CaseTime(case.get("file"), case.get("name"), float(case.get("time", 0)), _outcome(case)))
    return SuiteTimes(
        tests=tests,
        suite_seconds=sum(float(s.get("time", 0)) for s in suites),
        timestamp=suites[0].get("timestamp", "") if suites else "",
    )


def _outcome(case: ElementTree.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return {"failure": "failed"}.get(tag, tag)
    return "passed"


def per_file(tests: list[CaseTime]) -> list[tuple[str, float, int, int]]:
    """(file, seconds, number of tests, number skipped) per file, costliest first."""
    seconds, counts, skipped = defaultdict(float), defaultdict(int), defaultdict(int)
    for test in tests:
        seconds[test.file] += test.seconds
        counts[test.file] += 1
        skipped[test.file] += test.outcome == "skipped"
    return sorted(
        ((f, seconds[f], counts[f], skipped[f]) for f in seconds), key=lambda row: (-row[1], row[0])
    )


def format_report(
    times: SuiteTimes, set_up_seconds: float | None = None, top: int = 20, workers: int = 1
) -> str:
    in_tests = sum(t.seconds for t in times.tests)
    capacity = times.suite_seconds * workers  # what the workers had to spend
    outcomes = defaultdict(int)
    for test in times.tests:
        outcomes[test.outcome] += 1
    date = times.timestamp[:10] or datetime.now().date().isoformat()
    lines = [f"## Test suite times ({date})", ""]
    summary = f"pytest: {_minutes(times.suite_seconds)} for {len(times.tests)} tests"
    summary += " (" + ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items())) + ")"
    if workers > 1:
        summary += f" on {workers} workers, {_minutes(in_tests)} of test time"
    if set_up_seconds is not None:
        total = set_up_seconds + times.suite_seconds
        summary += f"; set-up before it {_minutes(set_up_seconds)}; in all {_minutes(total)}"
    lines += [summary + ".", "", "| file | tests | skipped | seconds | share |", "|---|---:|---:|---:|---:|"]
    for file, seconds, count, skipped in per_file(times.tests):
        lines.append(f"| {file} | {count} | {skipped} | {seconds:.1f} | {_share(seconds, capacity)} |")
    outside = max(capacity - in_tests, 0.0)
    what = "collection, imports" + (", a worker idle" if workers > 1 else "")
    lines.append(f"| (outside tests: {what}) | | | {outside:.1f} | {_share(outside, capacity)} |")
    lines += ["", f"Top {top} tests:", "", "| test | seconds | outcome |", "|---|---:|---|"]
    for test in sorted(times.tests, key=lambda t: -t.seconds)[:top]:
        lines.append(f"| {test.file}::{test.name} | {test.seconds:.1f} | {test.outcome} |")
    return "\n".join(lines) + "\n"


def _share(seconds: float, capacity: float) -> str:
    return f"{100 * seconds / capacity:.1f}%" if capacity else "-"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min ({seconds:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml", help="pytest --junitxml report (junit_family=xunit1)")
    parser.add_argument("--set-up-seconds", type=float, help="seconds of set-up before pytest started")
    parser.add_argument("--workers", type=int, default=1, help="how many parallel workers ran the tests")
    parser.add_argument("--top", type=int, default=20, help="how many of the costliest tests to list")
    args = parser.parse_args(argv)
    try:
        times = read_junit(args.junit_xml)
    except (OSError, ElementTree.ParseError, ValueError) as exc:
        print(f"suite_times: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(format_report(times, args.set_up_seconds, args.top, args.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
