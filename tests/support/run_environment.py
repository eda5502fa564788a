"""A run whose coordinator-started environment process is killed -9 after the run's first step
(the managed Environment gRPC service, or a managed OpenEnv server): what the tests assert on."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from rollway.coordinator.v1 import coordinator_pb2
from support.processes import descendants_running
from support.stack import coordinator_stub, start_run, wait_run
from support.waiting import wait_until


@dataclass
class KilledEnvironmentRun:
    info: object  # the finished run's RunInfo
    first: int  # the killed environment's pid
    first_address: str  # its address, as the run had it
    replaced: list[int]  # the environment processes started after the kill


def trained_steps(run_dir: Path) -> list[dict]:
    """The run's step records that trained (metrics.jsonl), in order."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in records if "train/grad_norm" in r]


def run_killing_its_environment(coordinator, run_id: str, config: dict, module: str) -> KilledEnvironmentRun:
    """Start the run, kill -9 its environment process (`python -m <module>`) once a step is
    logged, wait for a new one and for the run's end."""
    stub = coordinator_stub(coordinator)
    started = start_run(stub, run_id, config)
    run_dir = Path(stub.GetRun(coordinator_pb2.GetRunRequest(run_id=started.run_id)).run.run_dir)
    wait_until(lambda: trained_steps(run_dir), 120, "the run's first step")
    [first] = descendants_running(coordinator.pid, module)
    running = stub.GetRun(coordinator_pb2.GetRunRequest(run_id=started.run_id)).run
    os.kill(first, signal.SIGKILL)
    replaced: list[int] = []
    wait_until(
        lambda: (
            replaced.extend(p for p in descendants_running(coordinator.pid, module) if p != first) or replaced
        ),
        60,
        f"a new {module} process",
    )
    info = wait_run(stub, started.run_id, timeout=180)
    return KilledEnvironmentRun(info, first, running.service_addresses["environment"], replaced)
