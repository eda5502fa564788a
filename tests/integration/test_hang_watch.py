"""The coordinator's hang watch against real service processes (the shared runtime's probe
service): a frozen process (SIGSTOP) and a call that stops making progress while its process
still answers are found hung after the bound, and named; a slow call that makes progress is not."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import grpc
import pytest
from support.probe_service import SERVICE
from support.processes import ServiceProcess
from support.waiting import wait_until

from rollway.common.client import open_channel
from rollway.common.v1 import progress_pb2, progress_pb2_grpc
from rollway.coordinator.watch import FIRST_CALL_HUNG_SECONDS, MIN_HUNG_SECONDS, HangWatch

BOUND = 1.5  # hung_service_seconds of these tests
# The probe's drain: its stuck Sleep would hold the fixture's stop for the default 30 s grace;
# these tests assert nothing of the drain (tests/integration/test_runtime.py does).
GRACE_SECONDS = "0.5"


TESTS_DIR = str(Path(__file__).resolve().parents[1])  # support.probe_service lives there


@pytest.fixture
def probe(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])}
    with ServiceProcess(
        "probe",
        ["--grace-seconds", GRACE_SECONDS],
        tmp_path / "probe",
        module="support.probe_service",
        env=env,
    ) as process:
        yield process


def call_in_background(address: str, method: str, payload: bytes) -> threading.Thread:
    def call():
        with open_channel(address) as channel:
            try:
                channel.unary_unary(f"/{SERVICE}/{method}")(payload, timeout=60)
            except grpc.RpcError:
                pass  # the process was stopped under it

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def watch_until_hung(watch: HangWatch, timeout: float):
    """Poll as the coordinator's watcher does (every 0.1 s here); the hang and when it was seen."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        watch.poll()
        hung = watch.hung()
        if hung is not None:
            return hung, time.monotonic() - started
        time.sleep(0.1)
    return None, timeout


def test_a_call_that_makes_no_progress_is_named_hung_after_the_bound(probe):
    watch = HangWatch({"probe": [probe.address]}, hung_service_seconds=BOUND)
    try:
        # A deadlocked handler (gRPC still answers), long enough to outlast the watch's verdict
        # (BOUND + 5 s at most) and short enough that the probe's graceful stop, which lets it
        # finish, costs little.
        call_in_background(probe.address, "Sleep", str(BOUND + 8).encode())
        hung, seconds = watch_until_hung(watch, 15)
        assert hung is not None
        assert (hung.name, hung.index) == ("probe", 0)
        assert f"(pid {probe.pid}) is hung: its Sleep made no progress" in hung.detail
        assert BOUND <= seconds < BOUND + 5
    finally:
        watch.close()


def test_a_slow_call_that_makes_progress_is_not_hung(probe):
    watch = HangWatch({"probe": [probe.address]}, hung_service_seconds=BOUND)
    try:
        worker = call_in_background(probe.address, "Work", b"4")  # 4 s, beating every 0.1 s
        hung, _ = watch_until_hung(watch, 3.5)
        assert hung is None, hung
        worker.join(10)
        # Its duration now sizes the automatic bound: at least MIN_HUNG_SECONDS.
        with open_channel(probe.address) as channel:
            reply = progress_pb2_grpc.ProgressServiceStub(channel).GetProgress(
                progress_pb2.GetProgressRequest()
            )
        assert 3.9 < reply.median_seconds["Work"] < 6
        assert reply.pid == probe.pid and not reply.calls
    finally:
        watch.close()


def test_a_frozen_process_is_named_hung_and_a_thawed_one_is_not(probe):
    watch = HangWatch({"probe": [probe.address]}, hung_service_seconds=BOUND)
    try:
        watch.poll()
        wait_until(
            lambda: watch.hung() is None and watch._targets[0].progress is not None, 5, "a first answer"
        )
        os.kill(probe.pid, signal.SIGSTOP)
        try:
            hung, seconds = watch_until_hung(watch, 15)
            assert hung is not None and hung.name == "probe"
            assert f"(pid {probe.pid}, at {probe.address}) is hung: it answered nothing" in hung.detail
            assert BOUND - 0.5 <= seconds < BOUND + 5
        finally:
            os.kill(probe.pid, signal.SIGCONT)
        wait_until(lambda: watch.poll() or watch.hung() is None, 10, "the thawed process to answer again")
    finally:
        watch.close()


def test_the_automatic_bound_is_ten_times_the_usual_duration_and_at_least_a_minute():
    watch = HangWatch({})
    few = progress_pb2.GetProgressResponse(median_seconds={"TrainStep": 0.4})
    many = progress_pb2.GetProgressResponse(median_seconds={"TrainStep": 15.0, "SaveCheckpoint": 30.0})
    assert watch._threshold(few, "TrainStep") == MIN_HUNG_SECONDS
    assert watch._threshold(many, "TrainStep") == 150.0
    assert watch._threshold(many) == 300.0  # frozen: sized by its slowest kind of call
    assert watch._threshold(few, "Generate") == FIRST_CALL_HUNG_SECONDS  # none completed yet
    assert watch._threshold(None) == MIN_HUNG_SECONDS  # frozen before any call completed
    assert HangWatch({}, hung_service_seconds=7.0)._threshold(many, "TrainStep") == 7.0


def test_a_pause_in_probing_blames_no_service_that_answers(probe):
    """The watch loop itself may stall (a call blocked on an unreachable node): silence is counted
    from the first probe that went unanswered, so a service that answers every probe it is sent
    is never blamed for the gap (a partition once got a healthy dataloader killed this way)."""
    watch = HangWatch({"probe": [probe.address]}, hung_service_seconds=BOUND)
    try:
        watch.poll()
        wait_until(lambda: watch._targets[0].unanswered_since is None, 10, "the first probe's answer")
        stalled_until = time.monotonic() + 2 * BOUND
        while time.monotonic() < stalled_until:  # the stalled loop: no probes sent, time passes
            time.sleep(0.1)
        watch.poll()
        assert watch.hung() is None
        hung, _ = watch_until_hung(watch, 1.0)
        assert hung is None
    finally:
        watch.close()
