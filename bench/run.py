"""Run every benchmark under bench/ (or the ones named), print tables, write bench/results/*.json.

python -m bench.run [--quick] [NAME ...]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

from bench.harness import format_table, write_result


def discover() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in Path(__file__).parent.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(discover())})"
    )
    parser.add_argument("--quick", action="store_true", help="small configurations (smoke run)")
    args = parser.parse_args(argv)
    names = args.names or discover()
    failed = []
    for name in names:
        module = importlib.import_module(f"bench.bench_{name}")
        start = time.perf_counter()
        try:
            result = module.run(quick=args.quick)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        path = write_result(result, time.perf_counter() - start)
        print(format_table(result))
        print(f"   -> {path}\n", flush=True)
    if failed:
        print(f"failed benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
