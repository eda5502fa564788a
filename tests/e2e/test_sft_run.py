"""SFT runs end to end over the real services and the coordinator's gRPC API."""

from __future__ import annotations

import json
import signal
from contextlib import ExitStack

import grpc
import pytest
from support.jsonl import read_metrics
from support.processes import ServiceProcess
from support.stack import coordinator_stub, sft_service_args, start_run, start_services, wait_run

from rollway.common.client import open_channel
from rollway.coordinator.v1 import coordinator_pb2
from rollway.trainer.v1 import trainer_pb2, trainer_pb2_grpc

SUCCEEDED = coordinator_pb2.RUN_STATE_SUCCEEDED


def sft_run_config(services, **extra) -> dict:
    return {
        "loss_type": "sft_loss",
        "rollout_batch_size": 32,
        "global_batch_size": 32,
        "dataloader_addr": services["dataloader"].address,
        "trainer_addr": services["trainer"].address,
        **extra,
    }


def trainer_checksum(service: ServiceProcess) -> str:
    stub = trainer_pb2_grpc.TrainerServiceStub(open_channel(service.address))
    return stub.WeightChecksum(trainer_pb2.WeightChecksumRequest(dtype="float32")).checksum.digest


def test_sft_run_lowers_loss_and_streams_metrics_over_the_grpc_api(
    tiny_model_dir, demo_data_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("ROLLWAY_TRACE_FILE", str(tmp_path / "spans.jsonl"))  # every service appends its spans
    with ExitStack() as stack:
        services = start_services(stack, tmp_path, sft_service_args(tiny_model_dir, demo_data_dir))
        stub = coordinator_stub(services["coordinator"])
        info = start_run(stub, "sft", sft_run_config(services, num_rollout=12))
        assert info.run_id == "sft" and info.num_steps == 12
        streamed = list(stub.StreamMetrics(coordinator_pb2.StreamMetricsRequest(run_id="sft"), timeout=300))
        final = stub.GetRun(coordinator_pb2.GetRunRequest(run_id="sft")).run
        assert final.state == SUCCEEDED, final.error
        assert [m.step for m in streamed] == list(range(12))
        losses = [m.metrics["sft/loss"] for m in streamed]
        assert losses[-1] < 0.6 * losses[0]
        assert streamed[-1].metrics["sft/tokens_seen"] > streamed[0].metrics["sft/tokens_seen"] > 0
        assert "data/prefetch_queue_depth" in streamed[0].metrics
        on_disk = read_metrics(tmp_path / "runs" / "sft")
        assert [r["sft/loss"] for r in on_disk] == pytest.approx(losses)
        assert list((tmp_path / "runs" / "sft" / "tensorboard").glob("events.*"))
        runs = stub.ListRuns(coordinator_pb2.ListRunsRequest()).runs
        assert [r.run_id for r in runs] == ["sft"] and runs[0].step == 12

        with pytest.raises(grpc.RpcError) as refused:
            start_run(stub, "bad", sft_run_config(services, rollout_batch_size=3, global_batch_size=2))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("config.global_batch_size:")
        with pytest.raises(grpc.RpcError) as unknown:
            stub.GetRun(coordinator_pb2.GetRunRequest(run_id="nope"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

    # One trace per step, spanning the coordinator, the dataloader and the trainer.
    spans = [json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    steps = [s for s in spans if s["name"] == "sft_step"]
    assert sorted(s["attributes"]["step"] for s in steps) == list(range(12))
    step_3 = next(s for s in steps if s["attributes"]["step"] == 3)
    in_trace = [s for s in spans if s["trace_id"] == step_3["trace_id"]]
    assert {s["service"] for s in in_trace} == {
        "rollway-coordinator",
        "rollway-dataloader",
        "rollway-trainer",
    }
    assert {s["name"] for s in in_trace if s["kind"] == "SERVER"} >= {
        "/rollway.trainer.v1.TrainerService/TrainStep",
        "/rollway.dataloader.v1.DataloaderService/NextBatch",
    }


def _run_to_end(
    tmp_path, model_dir, data_dir, name: str, *, kill_after_checkpoint: bool
) -> tuple[list[dict], str]:
    """Run 8 SFT steps with a checkpoint every 3; optionally SIGKILL the coordinator after the first one
    and resume with a fresh coordinator. Returns the metrics, the trainer's final weights checksum and
    the --debug-determinism records (per-step hashes of data and weights, and the loss)."""
    workdir = tmp_path / name
    save = workdir / "save"
    with ExitStack() as stack:
        services = start_services(stack, workdir, sft_service_args(model_dir, data_dir))
        config = sft_run_config(
            services, num_rollout=8, save=str(save), save_interval=3, debug_determinism=True
        )
        stub = coordinator_stub(services["coordinator"])
        start_run(stub, name, config)
        if kill_after_checkpoint:
            for record in stub.StreamMetrics(coordinator_pb2.StreamMetricsRequest(run_id=name), timeout=300):
                if record.step >= 3 and (save / "latest_checkpointed_iteration.txt").exists():
                    break
            services["coordinator"].signal(signal.SIGKILL)
            services["coordinator"].stop()
            coordinator = stack.enter_context(
                ServiceProcess("coordinator", ["--runs-root", str(workdir / "runs")], workdir)
            )
            stub = coordinator_stub(coordinator)
            # The same run id again, with resume: continues from the latest complete checkpoint.
            start_run(stub, name, {**config, "resume": True})
        final = wait_run(stub, name)
        assert final.state == SUCCEEDED, final.error
        determinism = [
            json.loads(line)
            for line in (workdir / "runs" / name / "determinism.jsonl").read_text().splitlines()
        ]
        return read_metrics(workdir / "runs" / name), trainer_checksum(services["trainer"]), determinism


def test_killed_coordinator_resumes_with_the_same_data_and_weights(tiny_model_dir, demo_data_dir, tmp_path):
    straight, straight_weights, straight_hashes = _run_to_end(
        tmp_path, tiny_model_dir, demo_data_dir, "straight", kill_after_checkpoint=False
    )
    resumed, resumed_weights, resumed_hashes = _run_to_end(
        tmp_path, tiny_model_dir, demo_data_dir, "resumed", kill_after_checkpoint=True
    )
    # Each step once: the steps redone after the checkpoint replaced their first records.
    assert [r["step"] for r in resumed] == list(range(8))
    by_step = {r["step"]: r for r in resumed}
    assert [by_step[s]["sft/loss"] for s in range(8)] == pytest.approx(
        [r["sft/loss"] for r in straight], rel=1e-5
    )
    assert [by_step[s]["sft/tokens_seen"] for s in range(8)] == [r["sft/tokens_seen"] for r in straight]
    assert resumed_weights == straight_weights
    # --debug-determinism: the same data and the same weights after every step, hash for hash.
    by_step = {h["step"]: h for h in resumed_hashes}
    assert [by_step[h["step"]] for h in straight_hashes] == straight_hashes
    assert (
        len({h["data"] for h in straight_hashes}) == 8 and len({h["weights"] for h in straight_hashes}) == 8
    )
