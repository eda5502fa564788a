"""Start the services of a run as real processes (tests of whole jobs)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from rollway.common.client import open_channel
from rollway.common.structs import to_struct
from rollway.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from support.processes import ServiceProcess, start_together


def sft_service_args(model_dir: Path, data_dir: Path, *, lr: float = 3e-3) -> dict[str, list[str]]:
    return {
        "dataloader": [
            "--hf-checkpoint",
            str(model_dir),
            "--prompt-data",
            str(data_dir / "sft.parquet"),
            "--input-key",
            "messages",
            "--apply-chat-template",
            "--loss-type",
            "sft_loss",
            "--num-epoch",
            "0",
            "--rollout-shuffle",
        ],
        "trainer": [
            "--hf-checkpoint",
            str(model_dir),
            "--lr",
            str(lr),
            "--use-dynamic-batch-size",
            "--max-tokens-per-gpu",
            "4096",
            "--loss-type",
            "sft_loss",
        ],
    }


def start_services(stack: ExitStack, workdir: Path, args: dict[str, list[str]]) -> dict[str, ServiceProcess]:
    """Start each named service (and a coordinator); every process is stopped when `stack` closes."""
    args = {**args, "coordinator": ["--runs-root", str(workdir / "runs")]}
    return start_together(stack, {name: ServiceProcess(name, a, workdir) for name, a in args.items()})


def coordinator_stub(service: ServiceProcess) -> coordinator_pb2_grpc.CoordinatorServiceStub:
    return coordinator_pb2_grpc.CoordinatorServiceStub(open_channel(service.address))


def start_run(stub, run_id: str, config: dict) -> coordinator_pb2.RunInfo:
    return stub.StartRun(coordinator_pb2.StartRunRequest(config=to_struct(config), run_id=run_id)).run


def wait_run(stub, run_id: str, timeout: float = 300.0) -> coordinator_pb2.RunInfo:
    """Follow StreamMetrics to its end, then return the run's final state."""
    list(stub.StreamMetrics(coordinator_pb2.StreamMetricsRequest(run_id=run_id), timeout=timeout))
    return stub.GetRun(coordinator_pb2.GetRunRequest(run_id=run_id)).run
