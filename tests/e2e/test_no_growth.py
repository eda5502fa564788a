"""Long-lived services do not grow run after run: five GRPO runs of the 50.6M model on the same
four services, then a trainer restart (a new trainer process re-syncs weights into the same
rollout service) and more runs. Each service's RSS after its last run stays within a margin of
its RSS after its first run (before the fix, rollout +0.38 GiB and trainer +0.4-0.8 GiB a run).

Margin: max(5% of the first run's RSS, 100 MiB). A leaked run at this size is at least one
fp32 copy of the weights (193 MiB), so the margin catches one leaked run in five, while leaving
room for what legitimately varies between runs (allocator slack, gRPC and log buffers)."""

from __future__ import annotations

import signal
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.processes import ServiceProcess, start_together
from support.stack import coordinator_stub, start_run, wait_run

from bench.bench_run_growth import grpo_config
from rollway.coordinator.v1 import coordinator_pb2

pytestmark = pytest.mark.slow

NUM_RUNS = 5
NUM_RUNS_AFTER_RESTART = 3
MiB = 2**20


def margin(first_rss: int) -> int:
    return max(first_rss // 20, 100 * MiB)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory):
    from rollway.demo.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("small-model"), seed=0, preset="small")


def run_and_measure(stub, run_id: str, config: dict, services: dict) -> dict[str, int]:
    """One run to its end, then every service's RSS."""
    start_run(stub, run_id, config)
    run = wait_run(stub, run_id, timeout=180)
    assert run.state == coordinator_pb2.RUN_STATE_SUCCEEDED, run.error
    assert run.step == 2
    return {name: rss_bytes(service.pid) for name, service in services.items()}


def assert_no_growth(first: dict[str, int], last: dict[str, int], names, when: str) -> None:
    table = {n: f"{first[n] / MiB:.0f} -> {last[n] / MiB:.0f} MiB" for n in names}
    for name in names:
        assert last[name] - first[name] <= margin(first[name]), f"{name} grew {when}: {table}"


def test_services_do_not_grow_across_runs_or_after_a_trainer_restart(
    small_model_dir, demo_data_dir, tmp_path
):
    with ExitStack() as stack:
        services = {name: ServiceProcess(name, [], tmp_path) for name in ("dataloader", "trainer", "rollout")}
        services["coordinator"] = ServiceProcess(
            "coordinator", ["--runs-root", str(tmp_path / "runs")], tmp_path
        )
        start_together(stack, services)
        stub = coordinator_stub(services["coordinator"])
        config = grpo_config(small_model_dir, demo_data_dir, services)
        after = [run_and_measure(stub, f"run-{i}", config, services) for i in range(1, NUM_RUNS + 1)]
        assert_no_growth(after[0], after[-1], services, f"over {NUM_RUNS} runs")

        # A new trainer process (kill -9, then a fresh one) re-syncs weights into the same
        # rollout service: neither the rollout service nor the new trainer may grow.
        services["trainer"].proc.send_signal(signal.SIGKILL)
        services["trainer"].proc.wait(timeout=30)
        services["trainer"] = stack.enter_context(ServiceProcess("trainer", [], tmp_path / "trainer-2"))
        config = grpo_config(small_model_dir, demo_data_dir, services)
        restarted = [
            run_and_measure(stub, f"after-restart-{i}", config, services)
            for i in range(1, NUM_RUNS_AFTER_RESTART + 1)
        ]
        assert_no_growth(restarted[0], restarted[-1], ["trainer"], "after its restart")
        others = ["dataloader", "rollout", "coordinator"]
        assert_no_growth(after[0], restarted[-1], others, "through a trainer restart")
