"""Runs on a real coordinator that starts its own services: the end of data is settled up front
(num_rollout wins and the data loops; num_rollout 0 runs num_epoch epochs), a finished run's
history is never replaced, and a restarted coordinator lists and gets earlier runs from disk."""

from __future__ import annotations

import grpc
import pytest
from support.processes import ServiceProcess
from support.stack import coordinator_stub, start_run

from rollway.common.structs import from_struct, to_struct
from rollway.coordinator.v1 import coordinator_pb2

pytestmark = pytest.mark.slow

SUCCEEDED = coordinator_pb2.RUN_STATE_SUCCEEDED


def sft(model, data, rows: int, **overrides) -> dict:
    return {
        "hf_checkpoint": str(model),
        "prompt_data": [f"{data / 'sft.parquet'}@[0:{rows}]"],
        "input_key": "messages",
        "apply_chat_template": True,
        "loss_type": "sft_loss",
        "rollout_batch_size": 8,
        "global_batch_size": 8,
        "lr": 1e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        **overrides,
    }


def follow(stub, run_id: str) -> list[coordinator_pb2.StreamMetricsResponse]:
    return list(stub.StreamMetrics(coordinator_pb2.StreamMetricsRequest(run_id=run_id), timeout=300))


def test_end_of_data_history_and_a_restarted_coordinator(tmp_path, tiny_model_dir, demo_data_dir):
    runs_root = tmp_path / "runs"
    args = ["--runs-root", str(runs_root)]  # and a dashboard, on a free port
    with ServiceProcess("coordinator", args, tmp_path / "first") as coordinator:
        stub = coordinator_stub(coordinator)
        # num_rollout wins: 3 steps of 8 over 16 rows loop into a second epoch (they ended at 2).
        looping = start_run(stub, "looping", sft(tiny_model_dir, demo_data_dir, 16, num_rollout=3))
        assert looping.num_steps == 3
        assert "num_rollout" in looping.end_of_data
        records = follow(stub, "looping")
        assert [r.step for r in records] == [0, 1, 2]
        assert [r.metrics["sft/epoch"] for r in records] == [0.0, 1.0, 1.0]
        assert records[-1].state == SUCCEEDED  # the stream's last record carries the final state
        assert all(r.state == coordinator_pb2.RUN_STATE_RUNNING for r in records[:-1])
        # num_rollout 0: num_epoch epochs, their steps known before the start: 2 * 20 // 8 = 5.
        epochs = start_run(stub, "epochs", sft(tiny_model_dir, demo_data_dir, 20, num_rollout=0, num_epoch=2))
        assert epochs.num_steps == 5
        assert "num_epoch 2 x 20 rows / rollout_batch_size 8 = 5 steps" == epochs.end_of_data
        assert [r.step for r in follow(stub, "epochs")] == [0, 1, 2, 3, 4]
        done = stub.GetRun(coordinator_pb2.GetRunRequest(run_id="epochs")).run
        assert (done.state, done.step, done.num_steps) == (SUCCEEDED, 5, 5)
        assert done.created_time <= done.started_time <= done.finished_time
        assert done.seconds_per_step > 0 and done.eta_seconds == 0
        assert done.dashboard_url.startswith("http://") and done.dashboard_url.endswith("/?run=epochs")
        # RunInfo.config is the flat config StartRun took: sent back (with a new id), it is accepted.
        given = sft(tiny_model_dir, demo_data_dir, 20, num_rollout=0, num_epoch=2)
        assert from_struct(done.config) == given  # (a Struct's numbers are floats: 2.0 == 2)
        again = stub.ValidateRun(coordinator_pb2.ValidateRunRequest(config=done.config, run_id="again"))
        assert again.num_steps == 5
        # A finished run's id is refused; its history stays byte for byte.
        metrics = (runs_root / "looping" / "metrics.jsonl").read_bytes()
        for resume in (False, True):
            with pytest.raises(grpc.RpcError) as caught:
                start_run(
                    stub, "looping", sft(tiny_model_dir, demo_data_dir, 16, num_rollout=1, resume=resume)
                )
            assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert ("nothing to resume" if resume else "its history is kept") in caught.value.details()
        assert (runs_root / "looping" / "metrics.jsonl").read_bytes() == metrics
        with pytest.raises(grpc.RpcError) as caught:  # ValidateRun checks the id as StartRun does
            stub.ValidateRun(
                coordinator_pb2.ValidateRunRequest(
                    config=to_struct(sft(tiny_model_dir, demo_data_dir, 16, num_rollout=1)), run_id="looping"
                )
            )
        assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
        before = {r.run_id: r for r in stub.ListRuns(coordinator_pb2.ListRunsRequest()).runs}
    with ServiceProcess("coordinator", args, tmp_path / "second") as coordinator:
        stub = coordinator_stub(coordinator)
        after = {r.run_id: r for r in stub.ListRuns(coordinator_pb2.ListRunsRequest()).runs}
        assert set(after) == {"looping", "epochs"}
        for run_id, run in after.items():
            # The times and the config survive the restart (0.0 and nested by component before #38).
            assert run.started_time == before[run_id].started_time > 0
            assert run.finished_time == before[run_id].finished_time >= run.started_time
            assert run.config == before[run_id].config
            assert (run.state, run.step, run.num_steps) == (
                SUCCEEDED,
                before[run_id].step,
                before[run_id].num_steps,
            )
            assert "sft/loss" in run.last_metrics and "sft/loss" in before[run_id].last_metrics
            assert run.last_metrics["sft/loss"] == pytest.approx(before[run_id].last_metrics["sft/loss"])
        got = stub.GetRun(coordinator_pb2.GetRunRequest(run_id="looping")).run
        assert (got.state, got.step, got.run_dir) == (SUCCEEDED, 3, str(runs_root / "looping"))
        assert [r.step for r in follow(stub, "looping")] == [0, 1, 2]  # replayed from metrics.jsonl
        with pytest.raises(grpc.RpcError) as caught:
            start_run(stub, "looping", sft(tiny_model_dir, demo_data_dir, 16, num_rollout=1))
        assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_the_final_evaluation_reaches_last_metrics(tmp_path, tiny_model_dir, demo_data_dir):
    """The run's last step does not evaluate (eval_interval 10); the evaluation after it does, and
    GetRun's last_metrics carries it (it had the last step's metrics only)."""
    config = {
        "hf_checkpoint": str(tiny_model_dir),
        "prompt_data": [str(demo_data_dir / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 2,
        "global_batch_size": 8,
        "num_rollout": 2,
        "rollout_max_response_len": 6,
        "rm_type": "exact_match",
        "eval_prompt_data": ["add", f"{demo_data_dir / 'eval.parquet'}@[0:8]"],
        "eval_interval": 10,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
    }
    with ServiceProcess("coordinator", ["--runs-root", str(tmp_path / "runs")], tmp_path) as coordinator:
        stub = coordinator_stub(coordinator)
        start_run(stub, "eval", config)
        records = follow(stub, "eval")
        info = stub.GetRun(coordinator_pb2.GetRunRequest(run_id="eval")).run
    assert info.state == SUCCEEDED, info.error
    assert [r.step for r in records] == [0, 1, 2]  # step 2: the final evaluation's record
    assert "eval/add" in records[0].metrics and "eval/add" not in records[1].metrics
    assert "eval/add" in info.last_metrics  # (a proto map answers 0.0 for a missing key)
    assert info.last_metrics["eval/add"] == records[2].metrics["eval/add"]
    assert info.last_metrics["train/pg_loss"] == records[1].metrics["train/pg_loss"]


def test_stream_records_come_as_written_and_a_stopped_run_ends_the_stream(
    tmp_path, tiny_model_dir, demo_data_dir
):
    with ServiceProcess("coordinator", ["--runs-root", str(tmp_path / "runs")], tmp_path) as coordinator:
        stub = coordinator_stub(coordinator)
        start_run(stub, "stopped", sft(tiny_model_dir, demo_data_dir, 16, num_rollout=200))
        stream = stub.StreamMetrics(coordinator_pb2.StreamMetricsRequest(run_id="stopped"), timeout=300)
        first = next(stream)  # records come as they are written, not a step late
        assert (first.step, first.state) == (
            0,
            coordinator_pb2.RUN_STATE_RUNNING,
        ) and "sft/loss" in first.metrics
        stub.StopRun(coordinator_pb2.StopRunRequest(run_id="stopped"))
        rest = list(stream)  # ends with the run: no extra record (clients count steps by records)
        info = stub.GetRun(coordinator_pb2.GetRunRequest(run_id="stopped")).run
    assert info.state == coordinator_pb2.RUN_STATE_STOPPED
    assert [r.step for r in [first, *rest]] == list(range(len(rest) + 1)) and info.step == len(rest) + 1
    assert all(r.state == coordinator_pb2.RUN_STATE_RUNNING and "sft/loss" in r.metrics for r in rest)
