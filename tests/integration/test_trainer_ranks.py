"""Trainer rank processes: no orphans after SIGTERM, a dead or hung rank is reported, never a hang;
a supervised trainer exits when a rank dies, to be restarted with all of them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import ServiceProcess, alive, descendants

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.trainer.v1 import trainer_pb2 as pb
from rollway.trainer.v1 import trainer_pb2_grpc

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def start_trainer(tiny_model_dir, workdir: Path, *extra: str) -> ServiceProcess:
    args = ["--hf-checkpoint", str(tiny_model_dir), "--world-size", "2", "--dtype", "float32"]
    args += ["--loss-type", "sft_loss", *extra]
    return ServiceProcess("trainer", args, workdir).start()


def train_step(stub, step_id: int, timeout: float = 60.0):
    sample = common_pb2.Sample(prompt_token_ids=[1, 5], response_token_ids=[6, 7, 2], loss_mask=[1, 1, 1])
    requests = [
        pb.TrainStepRequest(header=pb.TrainStepHeader(step_id=step_id, num_samples=1)),
        pb.TrainStepRequest(samples=pb.SampleChunk(samples=[sample])),
    ]
    return stub.TrainStep(iter(requests), timeout=timeout)


def health(address: str) -> int:
    with open_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()).status


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_a_killed_rank_is_reported_health_goes_not_serving_the_next_init_rebuilds_and_sigterm_stops_all(
    tiny_model_dir, tmp_path
):
    """A killed rank is reported and the next Init rebuilds the ranks; then SIGTERM on rank 0
    stops the other ranks too (no orphans)."""
    svc = start_trainer(tiny_model_dir, tmp_path)
    stopped = False
    try:
        workers = children(svc.pid)
        assert len(workers) == 1 and alive(workers[0]), f"rank 0 spawned one worker rank: {workers}"
        with open_channel(svc.address) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            stub.Init(pb.InitRequest())
            assert train_step(stub, 0).global_step == 1
            (worker,) = children(svc.pid)
            os.kill(worker, signal.SIGKILL)
            # Rank 0 notices on its own (it watches its workers) and stops advertising SERVING.
            assert wait_for(lambda: health(svc.address) == health_pb2.HealthCheckResponse.NOT_SERVING, 10.0)
            with pytest.raises(grpc.RpcError) as err:
                train_step(stub, 1)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "trainer rank 1 exited with code -9" in err.value.details()
            # Nothing restarts this trainer: the next Init builds new ranks, from the model's start.
            assert stub.Init(pb.InitRequest()).rebuilt
            assert health(svc.address) == health_pb2.HealthCheckResponse.SERVING
            (new_worker,) = descendants(svc.pid)  # spawned by a gRPC thread: not in the main task's children
            assert new_worker != worker and alive(new_worker)
            assert train_step(stub, 1).global_step == 1
        # SIGTERM on rank 0: it exits cleanly and its rank 1 goes with it.
        stopped = True
        assert svc.stop() == 0, "rank 0's exit code after SIGTERM"
        assert wait_for(lambda: not alive(new_worker), 10.0), "rank 1 outlived rank 0"
    finally:
        if not stopped:
            assert svc.stop() == 0


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_a_killed_rank_makes_a_supervised_trainer_exit_to_be_restarted_whole(tiny_model_dir, tmp_path):
    """With exit_when_ranks_break (the coordinator's launcher sets it) a dead rank ends the
    trainer, with its own exit code and the reason in its log, so that its launcher restarts it
    with every rank; the ranks still running are stopped with it."""
    svc = start_trainer(tiny_model_dir, tmp_path, "--world-size", "3", "--exit-when-ranks-break")
    try:
        with open_channel(svc.address) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            stub.Init(pb.InitRequest())
            assert train_step(stub, 0).global_step == 1
        rank_1, rank_2 = children(svc.pid)
        os.kill(rank_1, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(lambda: svc.proc.poll() is not None, 10.0), "the trainer outlived its rank"
        # Within the coordinator's grace for a failed call's service to be seen dead (3 s).
        assert time.monotonic() - killed < 3.0 + 1.0  # + the rank watch's poll
        assert svc.proc.returncode == 75
        assert "trainer ranks broken: exiting so that the launcher restarts every rank" in svc.log_text()
        assert "trainer rank 1 exited with code -9" in svc.log_text()
        assert wait_for(lambda: not alive(rank_2), 5.0), "rank 2 outlived the trainer"
    finally:
        svc.stop()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_a_hung_rank_times_out_instead_of_hanging(tiny_model_dir, tmp_path):
    svc = start_trainer(tiny_model_dir, tmp_path, "--distributed-timeout-seconds", "8")
    (worker,) = children(svc.pid)
    try:
        with open_channel(svc.address) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            stub.Init(pb.InitRequest())
            os.kill(worker, signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                train_step(stub, 0)
            assert time.monotonic() - started < 30
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
            assert "train failed" in err.value.details()
            with pytest.raises(grpc.RpcError) as again:
                train_step(stub, 1)
            assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        svc.stop()
        os.kill(worker, signal.SIGCONT) if alive(worker) else None
    assert wait_for(lambda: not alive(worker), 10.0)


def test_a_missing_checkpoint_fails_start_up_with_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError) as err:
        ServiceProcess("trainer", ["--hf-checkpoint", str(tmp_path / "nope")], tmp_path).start()
    assert "exited with 2" in str(err.value)
    assert f"hf_checkpoint: no config.json in {tmp_path / 'nope'}" in str(err.value)
