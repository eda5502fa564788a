"""SIGTERM to a real rollout service mid-generation: the process exits within its grace period
plus a small margin, and the client streams end (aborted samples, or a clean status)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import grpc
from support.processes import ServiceProcess
from support.waiting import wait_until

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

ABORT = common_pb2.FINISH_REASON_ABORT
GRACE = 2.0
HOLD_AFTER = 8  # tokens: decoding then holds until the drain aborts it (support/held_generation.py)
TESTS_DIR = str(Path(__file__).resolve().parents[1])  # support.held_generation lives there
MARGIN = 5.0  # one decode step after the abort, the stop hooks, and interpreter exit (1-2 s on a busy
# 2-core machine: torch is loaded)


class Collect(threading.Thread):
    """Consumes one Generate stream in the background; `ended` is set when the stream ends."""

    def __init__(self, stub, request):
        super().__init__(daemon=True)
        self.stub, self.request, self.samples, self.error = stub, request, [], None
        self.ended = threading.Event()
        self.start()

    def run(self):
        try:
            self.samples = [r.sample for r in self.stub.Generate(self.request, timeout=300)]
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.ended.set()


def _long_request(n=4):
    return rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt(token_ids=[1, 50, 60, 70]), rollout_pb2.Prompt(token_ids=[1, 9])],
        n_samples_per_prompt=n,
        # Greedy decoding of the tiny model does not stop on these prompts; where decoding is held
        # (support/held_generation.py) they outlive any grace, whatever the machine's speed.
        sampling_params=common_pb2.SamplingParams(temperature=0.0, max_new_tokens=1000),
    )


def _start(tiny_model_dir, workdir, *extra, grace=GRACE, held=False):
    args = ["--hf-checkpoint", str(tiny_model_dir), "--reward", "none", "--grace-seconds", str(grace)]
    if not held:
        return ServiceProcess("rollout", [*args, *extra], workdir).start()
    env = {"PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])}
    args += ["--hold-after", str(HOLD_AFTER)]
    return ServiceProcess(
        "rollout", [*args, *extra], workdir, module="support.held_generation", env=env
    ).start()


def test_sigterm_mid_generation_exits_within_grace_and_streams_end_with_aborted_samples(
    tiny_model_dir, tmp_path
):
    svc = _start(tiny_model_dir, tmp_path, held=True)  # no sample can finish before the drain's abort
    try:
        stub = rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))
        calls = [Collect(stub, _long_request()) for _ in range(4)]  # one alone rarely hit the old hang
        wait_until(
            lambda: stub.GetInfo(rollout_pb2.GetInfoRequest()).num_samples_in_flight == 32, 60, "samples"
        )
        sent = time.monotonic()
        svc.signal()
        svc.proc.wait(GRACE + MARGIN)
        exited = time.monotonic() - sent
        assert all(call.ended.wait(MARGIN) for call in calls), "a client stream never ended"
    finally:
        svc.stop(timeout=5)
    assert exited < GRACE + MARGIN and svc.proc.returncode == 0, (exited, svc.proc.returncode)
    for call in calls:
        assert call.error is None, call.error
        assert len(call.samples) == 8 and all(s.finish_reason == ABORT for s in call.samples)
        assert all(0 < len(s.response_token_ids) == len(s.rollout_log_probs) < 1000 for s in call.samples)


def test_sigterm_ends_queued_calls_and_calls_waiting_for_resume_at_once(tiny_model_dir, tmp_path):
    # One call holds the only running slot and waits for Resume; another waits in the queue. Both
    # end with UNAVAILABLE as draining starts (they could never finish within the grace), and the
    # process exits long before its 30 s grace ends.
    svc = _start(tiny_model_dir, tmp_path, "--max-generate-calls", "1", grace=30.0)
    try:
        stub = rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))
        stub.Pause(rollout_pb2.PauseRequest())
        calls = [Collect(stub, _long_request(n=1)) for _ in range(2)]
        wait_until(
            lambda: stub.GetInfo(rollout_pb2.GetInfoRequest()).num_generate_calls_queued == 1, 30, "queue"
        )
        sent = time.monotonic()
        svc.signal()
        assert all(call.ended.wait(MARGIN) for call in calls), "a client stream never ended"
        svc.proc.wait(MARGIN)  # nothing left in flight: no need to wait for the 30 s grace
        exited = time.monotonic() - sent
    finally:
        svc.stop(timeout=5)
    assert exited < MARGIN and svc.proc.returncode == 0, (exited, svc.proc.returncode)
    for call in calls:
        assert call.error is not None and call.error.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in call.error.details() and not call.samples
