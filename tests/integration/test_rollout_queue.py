"""Generate calls beyond the running slots of a real rollout service wait in a bounded queue:
they all complete; a full queue refuses with RESOURCE_EXHAUSTED; a queued call whose client
cancels leaves the queue; a call that waits too long ends with DEADLINE_EXCEEDED."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from support.processes import ServiceProcess
from support.waiting import wait_until

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc


def _start(tiny_model_dir, workdir, *extra):
    args = ["--hf-checkpoint", str(tiny_model_dir), "--reward", "none", *extra]
    return ServiceProcess("rollout", args, workdir)


def _request(i: int, n: int = 2, max_new_tokens: int = 4) -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt(token_ids=[1, 10 + i % 200, 7])],
        n_samples_per_prompt=n,
        sampling_params=common_pb2.SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens),
        request_id=f"call-{i}",
    )


def _info(stub) -> rollout_pb2.GetInfoResponse:
    return stub.GetInfo(rollout_pb2.GetInfoRequest(), timeout=10)


def test_200_concurrent_calls_beyond_2_running_slots_all_complete(tiny_model_dir, tmp_path):
    with _start(tiny_model_dir, tmp_path, "--max-generate-calls", "2", "--generate-queue-size", "250") as svc:
        stub = rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))
        depths: list[tuple[int, int]] = []
        done = threading.Event()

        def watch() -> None:  # what GetInfo reports while the calls run
            while not done.is_set():
                info = _info(stub)
                depths.append((info.num_generate_calls_running, info.num_generate_calls_queued))
                time.sleep(0.05)

        def call(i: int) -> list[common_pb2.Sample]:
            return [r.sample for r in stub.Generate(_request(i), timeout=300)]

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with ThreadPoolExecutor(200) as pool:
            results = list(pool.map(call, range(200)))
        done.set()
        watcher.join(10)
        final = _info(stub)
    assert [len(samples) for samples in results] == [2] * 200
    for i, samples in enumerate(results):
        assert sorted(s.index for s in samples) == [0, 1]
        assert all(list(s.prompt_token_ids) == [1, 10 + i % 200, 7] for s in samples)
        assert all(len(s.response_token_ids) == 4 for s in samples)
    assert max(running for running, _ in depths) <= 2
    assert max(queued for _, queued in depths) > 100  # most calls really waited in the queue
    assert final.num_samples_generated == 400 and final.num_samples_aborted == 0
    assert (final.num_generate_calls_running, final.num_generate_calls_queued) == (0, 0)


class Call(threading.Thread):
    """One Generate call consumed in the background; cancel() cancels it from the client side."""

    def __init__(self, stub, request):
        super().__init__(daemon=True)
        self.samples, self.error = [], None
        self.call = stub.Generate(request, timeout=120)
        self.start()

    def run(self):
        try:
            self.samples = [r.sample for r in self.call]
        except grpc.RpcError as exc:
            self.error = exc

    def cancel(self):
        self.call.cancel()


@pytest.fixture
def small_queue(tiny_model_dir, tmp_path):
    args = ["--max-generate-calls", "1", "--generate-queue-size", "2", "--generate-queue-timeout", "4"]
    with _start(tiny_model_dir, tmp_path, *args) as svc:
        stub = rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))
        yield stub
        stub.Resume(rollout_pb2.ResumeRequest())


def test_full_queue_refuses_a_cancelled_call_leaves_it_and_a_long_wait_ends(small_queue):
    stub = small_queue
    stub.Pause(rollout_pb2.PauseRequest())  # the running call waits for Resume, holding its slot
    running = Call(stub, _request(0))
    wait_until(lambda: _info(stub).num_generate_calls_running == 1, 30, "the running call")
    queued = [Call(stub, _request(1)), Call(stub, _request(2))]
    wait_until(lambda: _info(stub).num_generate_calls_queued == 2, 30, "two queued calls")

    with pytest.raises(grpc.RpcError) as full:
        list(stub.Generate(_request(3), timeout=30))
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (
        "--generate-queue-size 2" in full.value.details() and "--max-generate-calls 1" in full.value.details()
    )

    queued[1].cancel()  # leaves the queue at once, making room
    wait_until(lambda: _info(stub).num_generate_calls_queued == 1, 10, "the cancelled call to leave")
    queued[1].join(10)
    assert queued[1].error.code() == grpc.StatusCode.CANCELLED

    queued[0].join(30)  # waited --generate-queue-timeout 4 s for the slot the paused call holds
    assert queued[0].error is not None and queued[0].error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "--generate-queue-timeout" in queued[0].error.details()
    assert (_info(stub).num_generate_calls_running, _info(stub).num_generate_calls_queued) == (1, 0)

    stub.Resume(rollout_pb2.ResumeRequest())
    running.join(30)
    assert running.error is None and len(running.samples) == 2
    after = [r.sample for r in stub.Generate(_request(4), timeout=30)]  # the slot was given back
    assert len(after) == 2
