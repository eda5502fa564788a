"""Memory of long-lived services run after run: GRPO runs of the 50.6M `small` model on the same
four services, each service's RSS (VmRSS) after each run; then a kill -9 and a fresh trainer, and
as many runs again (the rollout service receives weights from the new trainer).

Rows: phase ("same services" / "after trainer restart"), run, rss_<service>_mib.
Summary: growth of each service from its first run to its last (MiB). The test that holds the
bound is tests/e2e/test_no_growth.py; this records the figures.
"""

from __future__ import annotations

import signal
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.harness import BenchResult
from rollway.common.client import open_channel
from rollway.common.structs import to_struct
from rollway.common.supervision.service_process import ServiceProcess
from rollway.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc

SERVICES = ("dataloader", "trainer", "rollout", "coordinator")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def grpo_config(model: Path, data: Path, services: dict) -> dict:
    """A 2-step GRPO run of the small model on the given services (tests/e2e/test_no_growth.py
    runs the same)."""
    return {
        "hf_checkpoint": str(model),
        "prompt_data": [str(data / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "global_batch_size": 16,
        "num_rollout": 2,
        "rollout_max_response_len": 8,
        "lr": 1e-4,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        "dataloader_addr": services["dataloader"].address,
        "trainer_addr": services["trainer"].address,
        "rollout_addr": [services["rollout"].address],
    }


def _run(stub, run_id: str, config: dict, services: dict) -> dict[str, float]:
    stub.StartRun(coordinator_pb2.StartRunRequest(config=to_struct(config), run_id=run_id))
    list(stub.StreamMetrics(coordinator_pb2.StreamMetricsRequest(run_id=run_id), timeout=600))
    run = stub.GetRun(coordinator_pb2.GetRunRequest(run_id=run_id)).run
    if run.state != coordinator_pb2.RUN_STATE_SUCCEEDED:
        raise RuntimeError(f"run {run_id} ended {run.state}: {run.error}")
    return {f"rss_{name}_mib": round(_rss_mib(services[name].pid), 1) for name in SERVICES}


def run(quick: bool) -> BenchResult:
    from rollway.demo.data import make_demo_data
    from rollway.demo.tiny_model import make_tiny_model

    num_runs = 2 if quick else 5
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        model = make_tiny_model(work / "model", seed=0, preset="small")
        make_demo_data(work / "data", seed=0)
        services = {name: stack.enter_context(ServiceProcess(name, [], work)) for name in SERVICES[:3]}
        services["coordinator"] = stack.enter_context(
            ServiceProcess("coordinator", ["--runs-root", str(work / "runs")], work)
        )
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(open_channel(services["coordinator"].address))
        for phase in ("same services", "after trainer restart"):
            if phase != "same services":
                services["trainer"].proc.send_signal(signal.SIGKILL)
                services["trainer"].proc.wait(timeout=30)
                services["trainer"] = stack.enter_context(ServiceProcess("trainer", [], work / "trainer-2"))
            config = grpo_config(model, work / "data", services)
            for i in range(1, num_runs + 1):
                rows.append(
                    {"phase": phase, "run": i, **_run(stub, f"{phase.split()[0]}-{i}", config, services)}
                )
    first, last = rows[0], rows[-1]
    restarted = rows[num_runs]
    summary = {
        f"growth_{name}_mib": round(last[f"rss_{name}_mib"] - first[f"rss_{name}_mib"], 1)
        for name in SERVICES
        if name != "trainer"
    }
    summary["growth_trainer_mib"] = round(rows[num_runs - 1]["rss_trainer_mib"] - first["rss_trainer_mib"], 1)
    summary["growth_restarted_trainer_mib"] = round(last["rss_trainer_mib"] - restarted["rss_trainer_mib"], 1)
    return BenchResult(
        name="run_growth",
        rows=rows,
        units={f"rss_{name}_mib": "MiB" for name in SERVICES},
        config={"model": "small (50.6M, fp32)", "num_runs": num_runs, "steps_per_run": 2},
        notes="RSS of each service after each GRPO run on the same services",
        summary=summary,
    )
