"""Weight sync when a peer dies or a service stops: real trainer and rollout processes, a gloo group.

A dead trainer is noticed by the rollout service within seconds (not after the group timeout), and
SIGTERM ends a rollout service or a trainer within its grace period even while a group join or an
update is pending.
"""

from __future__ import annotations

import json
import re
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import pytest
from support.ports import free_port
from support.processes import ServiceProcess
from support.waiting import names_a_gone_peer, wait_until

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.group import REFUSED_GRACE_SECONDS
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from rollway.trainer.v1 import trainer_pb2, trainer_pb2_grpc

pytestmark = pytest.mark.slow
GROUP_TIMEOUT = 120.0  # every failure below must come long before it
GRACE = 1.0  # --grace-seconds of both services
MARGIN = 5.0  # what a stop may take beyond its grace (drain hooks, exit)
FAST = 6.0  # "within a few seconds"


def spec(port: int, world_size: int, rank_offset: int) -> common_pb2.WeightGroupSpec:
    return common_pb2.WeightGroupSpec(
        group_name=f"faults-{port}",
        master_address="127.0.0.1",
        master_port=port,
        world_size=world_size,
        rank_offset=rank_offset,
        backend="gloo",
        timeout_seconds=GROUP_TIMEOUT,
    )


def log_events(process: ServiceProcess) -> list[dict]:
    """The service's JSON log lines, each cut down to its event, weight_version and rank."""
    lines = [line for line in process.log_text().splitlines() if line.startswith("{")]
    keys = ("event", "weight_version", "rank")
    return [{k: v for k, v in json.loads(line).items() if k in keys} for line in lines]


def stopped_within(process: ServiceProcess, signum: int, timeout: float) -> float:
    """Send `signum`, wait for the exit; the seconds it took (fails past `timeout`)."""
    started = time.monotonic()
    process.signal(signum)
    try:
        process.proc.wait(timeout)
    except Exception:
        pytest.fail(
            f"{process.service} still running {timeout}s after {signum!r}:\n{process.log_text()[-3000:]}"
        )
    return time.monotonic() - started


class Pair:
    """A trainer and a rollout service (tiny model, gloo), with stubs."""

    def __init__(self, workdir, model_dir):
        common = ["--hf-checkpoint", str(model_dir), "--dtype", "float32", "--grace-seconds", str(GRACE)]
        self.trainer = ServiceProcess("trainer", common, workdir)
        self.rollout = ServiceProcess("rollout", [*common, "--reward", "none"], workdir)
        self.pool = ThreadPoolExecutor(4)

    def __enter__(self) -> Pair:
        list(ThreadPoolExecutor(2).map(ServiceProcess.start, [self.trainer, self.rollout]))
        self.channels = [open_channel(self.trainer.address), open_channel(self.rollout.address)]
        self.trainer_stub = trainer_pb2_grpc.TrainerServiceStub(self.channels[0])
        self.rollout_stub = rollout_pb2_grpc.RolloutServiceStub(self.channels[1])
        return self

    def __exit__(self, *exc) -> None:
        self.trainer.stop()
        self.rollout.stop()
        # A call still pending on a peer that is gone (the trainer's join of a group its test left
        # behind) would hold the pool until gRPC gives up on the connection: cancel it instead.
        for channel in self.channels:
            channel.close()
        self.pool.shutdown(wait=True, cancel_futures=True)

    def init_both(self, world_size: int) -> tuple[Future, Future, int]:
        """InitWeightGroup on both (rollout at rank 1), concurrently; (trainer call, rollout call, port)."""
        port = free_port()
        trainer = self.pool.submit(
            self.trainer_stub.InitWeightGroup,
            trainer_pb2.InitWeightGroupRequest(group=spec(port, world_size, 0)),
            timeout=GROUP_TIMEOUT + 30,
        )
        rollout = self.pool.submit(self.rollout_init, port, world_size)
        return trainer, rollout, port

    def rollout_init(self, port: int, world_size: int = 2):
        request = rollout_pb2.InitWeightGroupRequest(group=spec(port, world_size, 1))
        return self.rollout_stub.InitWeightGroup(request, timeout=GROUP_TIMEOUT + 30)

    def form_group_and_push(self) -> common_pb2.WeightManifest:
        """A group of two and version 1 pushed; returns the manifest of that push."""
        trainer, rollout, _ = self.init_both(2)
        trainer.result(60), rollout.result(60)
        push = self.trainer_stub.PushWeights(
            trainer_pb2.PushWeightsRequest(weight_version=1, bucket_size_bytes=1 << 20), timeout=120
        )
        manifest = next(push).manifest
        update = self.pool.submit(
            self.rollout_stub.UpdateWeights, rollout_pb2.UpdateWeightsRequest(manifest=manifest), timeout=120
        )
        list(push)
        assert update.result(60).weight_version == 1
        return manifest

    def update(self, manifest: common_pb2.WeightManifest, version: int) -> Future:
        request = rollout_pb2.UpdateWeightsRequest(manifest=manifest)
        request.manifest.weight_version = version
        return self.pool.submit(self.rollout_stub.UpdateWeights, request, timeout=GROUP_TIMEOUT + 30)


def failure(call: Future, timeout: float) -> tuple[grpc.RpcError, float]:
    """The call's error once it fails, and how long that took from now (fails past `timeout`)."""
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        call.result(timeout)
    return info.value, time.monotonic() - started


@pytest.fixture
def pair(tmp_path, tiny_model_dir):
    with Pair(tmp_path, tiny_model_dir) as services:
        yield services


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_trainer_gone_from_the_group_fails_updates_and_new_groups_in_seconds(pair, signum):
    manifest = pair.form_group_and_push()
    stopped_within(pair.trainer, signum, GRACE + MARGIN)

    error, seconds = failure(pair.update(manifest, 2), FAST)
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert "weight version 2 was not received" in error.details()
    assert re.search("Connection (closed|reset) by peer", error.details()), error.details()
    assert seconds < FAST

    # The coordinator rebuilds the group: nothing hosts the new store, so the join fails in seconds.
    rejoin = pair.pool.submit(pair.rollout_init, free_port())
    error, seconds = failure(rejoin, REFUSED_GRACE_SECONDS + FAST)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "nothing listens at 127.0.0.1:" in error.details() and "the trainer that hosts" in error.details()
    assert seconds < REFUSED_GRACE_SECONDS + 3
    info = pair.rollout_stub.GetInfo(rollout_pb2.GetInfoRequest())
    assert info.weight_version == 1  # still serving what it had

    assert stopped_within(pair.rollout, signal.SIGTERM, GRACE + MARGIN) < GRACE + MARGIN


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_trainer_gone_while_the_rollout_joins_fails_the_join_in_seconds(pair, signum):
    trainer, rollout, port = pair.init_both(3)  # rank 2 never comes: both wait in the rendezvous
    in_rendezvous = {"event": "weight group rendezvous", "rank": 1}
    wait_until(
        lambda: in_rendezvous in log_events(pair.rollout), 30, "the rollout reaches the trainer's store"
    )
    assert not rollout.done()
    stopped_within(pair.trainer, signum, GRACE + MARGIN)
    error, seconds = failure(rollout, FAST)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "could not be formed" in error.details() and names_a_gone_peer(error.details()), error.details()
    assert stopped_within(pair.rollout, signal.SIGTERM, GRACE + MARGIN) < GRACE + MARGIN


def test_sigterm_ends_the_rollout_and_the_trainer_while_a_join_is_pending(pair):
    trainer, rollout, port = pair.init_both(3)
    in_rendezvous = {"event": "weight group rendezvous", "rank": 1}
    wait_until(
        lambda: in_rendezvous in log_events(pair.rollout), 30, "the rollout reaches the trainer's store"
    )
    assert stopped_within(pair.rollout, signal.SIGTERM, GRACE + MARGIN) < GRACE + MARGIN
    assert not trainer.done()  # still waiting for rank 2 (and the rollout that left)
    assert stopped_within(pair.trainer, signal.SIGTERM, GRACE + MARGIN) < GRACE + MARGIN
    assert "cancelled: this member left the group" in pair.trainer.log_text()


def test_sigterm_ends_the_rollout_while_an_update_waits_for_bytes(pair):
    manifest = pair.form_group_and_push()
    update = pair.update(manifest, 2)  # the trainer is alive but never sends version 2
    receiving = {"event": "receiving weights", "weight_version": 2}
    wait_until(
        lambda: receiving in log_events(pair.rollout), 30, "the rollout waits for the bytes of version 2"
    )
    assert not update.done()
    assert stopped_within(pair.rollout, signal.SIGTERM, GRACE + MARGIN) < GRACE + MARGIN
    assert update.done()
