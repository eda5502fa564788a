"""Pause/resume, memory release, weight checksum and info on a real rollout service (hf engine)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import torch
from google.protobuf import struct_pb2
from support.processes import ServiceProcess
from transformers import AutoModelForCausalLM

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.common.weights_checksum import weights_checksum
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

ABORT = common_pb2.FINISH_REASON_ABORT
LONG = 1000  # greedy decoding of the tiny model does not stop within 1000 tokens on these prompts


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, tmp_path_factory):
    args = ["--hf-checkpoint", str(tiny_model_dir), "--reward", "none"]
    with ServiceProcess("rollout", args, tmp_path_factory.mktemp("rollout")) as svc:
        stub = rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))
        yield stub
        stub.Resume(rollout_pb2.ResumeRequest())  # never leave a Generate waiting at shutdown


@pytest.fixture(autouse=True)
def resumed_after_each_test(rollout):
    """One failing test must not leave the shared service paused for the next ones."""
    yield
    if _info(rollout).memory_released:
        rollout.ResumeMemory(rollout_pb2.ResumeMemoryRequest())
    rollout.Resume(rollout_pb2.ResumeRequest())
    deadline = time.monotonic() + 30
    while _info(rollout).num_samples_in_flight and time.monotonic() < deadline:
        time.sleep(0.05)


def _request(max_new_tokens=LONG, n=4, request_id=""):
    return rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt(token_ids=p) for p in ([1, 50, 60, 70], [1, 9], [1, 33, 44], [1, 120])],
        n_samples_per_prompt=n,
        sampling_params=common_pb2.SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens),
        request_id=request_id,
    )


class Collect(threading.Thread):
    """Consumes one Generate stream in the background."""

    def __init__(self, stub, request):
        super().__init__(daemon=True)
        self.stub, self.request, self.samples, self.error = stub, request, [], None
        self.start()

    def run(self):
        try:
            self.samples = [r.sample for r in self.stub.Generate(self.request, timeout=120)]
        except grpc.RpcError as exc:
            self.error = exc


def _info(stub):
    return stub.GetInfo(rollout_pb2.GetInfoRequest())


def _wait_in_flight(stub, count, timeout=30):
    deadline = time.monotonic() + timeout
    while _info(stub).num_samples_in_flight < count:
        assert time.monotonic() < deadline, "samples never started"
        time.sleep(0.01)


def test_pause_abort_ends_in_flight_samples_and_new_calls_wait_for_resume(rollout):
    before = _info(rollout)
    running = Collect(rollout, _request())
    _wait_in_flight(rollout, 16)
    reply = rollout.Pause(rollout_pb2.PauseRequest(mode=rollout_pb2.PAUSE_MODE_ABORT))
    running.join(30)
    assert reply.num_aborted == 16 and running.error is None
    assert len(running.samples) == 16 and all(s.finish_reason == ABORT for s in running.samples)
    assert all(0 < len(s.response_token_ids) == len(s.rollout_log_probs) < LONG for s in running.samples)
    assert _info(rollout).paused
    waiting = Collect(rollout, _request(max_new_tokens=5, n=1))
    time.sleep(1.0)
    assert waiting.is_alive() and not waiting.samples  # held while paused
    rollout.Resume(rollout_pb2.ResumeRequest())
    waiting.join(30)
    assert len(waiting.samples) == 4 and all(len(s.response_token_ids) == 5 for s in waiting.samples)
    after = _info(rollout)
    assert not after.paused and after.num_samples_aborted - before.num_samples_aborted == 16


def test_pause_wait_lets_in_flight_samples_finish(rollout):
    running = Collect(rollout, _request(max_new_tokens=200))
    _wait_in_flight(rollout, 16)
    reply = rollout.Pause(rollout_pb2.PauseRequest(mode=rollout_pb2.PAUSE_MODE_WAIT), timeout=60)
    assert reply.num_aborted == 0 and _info(rollout).num_samples_in_flight == 0
    running.join(30)
    rollout.Resume(rollout_pb2.ResumeRequest())
    assert len(running.samples) == 16 and all(len(s.response_token_ids) == 200 for s in running.samples)


def test_release_memory_refuses_generation_until_resumed(rollout, tiny_model_dir):
    digest = rollout.WeightChecksum(rollout_pb2.WeightChecksumRequest()).checksum.digest
    running = Collect(rollout, _request())
    _wait_in_flight(rollout, 16)
    with pytest.raises(grpc.RpcError) as busy:
        rollout.ReleaseMemory(rollout_pb2.ReleaseMemoryRequest(tags=["weights"]))
    assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "Pause" in busy.value.details()
    rollout.Pause(rollout_pb2.PauseRequest())  # default mode: abort
    running.join(30)
    rollout.ReleaseMemory(rollout_pb2.ReleaseMemoryRequest())  # no tags: everything
    rollout.Resume(rollout_pb2.ResumeRequest())
    assert _info(rollout).memory_released
    for call in (
        lambda: list(rollout.Generate(_request(5, 1))),
        lambda: rollout.WeightChecksum(rollout_pb2.WeightChecksumRequest()),
    ):
        with pytest.raises(grpc.RpcError) as released:
            call()
        assert released.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "ResumeMemory" in released.value.details()
    rollout.ResumeMemory(rollout_pb2.ResumeMemoryRequest(tags=["weights"]))
    assert not _info(rollout).memory_released
    assert len(list(rollout.Generate(_request(5, 1)))) == 4
    assert rollout.WeightChecksum(rollout_pb2.WeightChecksumRequest()).checksum.digest == digest


def test_memory_tags_are_checked(rollout):
    with pytest.raises(grpc.RpcError) as info:
        rollout.ReleaseMemory(rollout_pb2.ReleaseMemoryRequest(tags=["weights", "gpu"]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details().startswith(
        "tags[1]"
    )


def test_weight_checksum_matches_the_checkpoint_computed_here(rollout, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    served = rollout.WeightChecksum(rollout_pb2.WeightChecksumRequest()).checksum
    assert (served.digest, served.num_tensors) == weights_checksum(model.named_parameters(), torch.float32)
    assert served.algorithm == "sha256" and served.weight_version == 0
    as_bf16 = rollout.WeightChecksum(rollout_pb2.WeightChecksumRequest(dtype="bfloat16")).checksum
    assert as_bf16.digest == weights_checksum(model.named_parameters(), torch.bfloat16)[0] != served.digest
    with pytest.raises(grpc.RpcError) as info:
        rollout.WeightChecksum(rollout_pb2.WeightChecksumRequest(dtype="float33"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details().startswith("dtype")


def test_weight_sync_rpcs_refuse_requests_without_a_group_and_the_service_keeps_serving(rollout):
    # The transfers themselves are tested in test_weight_sync.py; here: bad requests answer cleanly.
    for call, request in (
        (rollout.InitWeightGroup, rollout_pb2.InitWeightGroupRequest()),
        (rollout.UpdateWeights, rollout_pb2.UpdateWeightsRequest()),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call(request)
        assert info.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
        assert "Traceback" not in info.value.details()
    assert _info(rollout).weight_version == 0


def test_info_describes_the_service(rollout, tiny_model_dir):
    info = _info(rollout)
    assert (info.model, info.engine, info.dtype, info.num_workers) == (
        str(tiny_model_dir),
        "hf",
        "float32",
        1,
    )
    assert list(info.rewards) == ["exact_match", "f1", "math"] and info.weight_version == 0


def test_generate_calls_beyond_the_running_slots_queue_and_resume_still_gets_through(rollout):
    rollout.Pause(rollout_pb2.PauseRequest())
    calls = [Collect(rollout, _request(max_new_tokens=3, n=1)) for _ in range(16)]  # 16 workers - 4 run
    deadline = time.monotonic() + 30
    while (_info(rollout).num_generate_calls_running, _info(rollout).num_generate_calls_queued) != (12, 4):
        assert time.monotonic() < deadline, "the calls never filled the running slots and the queue"
        time.sleep(0.02)
    assert all(call.is_alive() for call in calls)
    rollout.Resume(rollout_pb2.ResumeRequest(), timeout=10)  # control RPCs keep threads of their own
    for call in calls:
        call.join(30)
        assert call.error is None and len(call.samples) == 4
    info = _info(rollout)
    assert (info.num_generate_calls_running, info.num_generate_calls_queued) == (0, 0)


def test_abort_ends_one_request_and_a_response_prefix_continues_an_aborted_sample(rollout):
    target = Collect(rollout, _request(request_id="target"))
    other = Collect(rollout, _request(n=1, request_id="other"))
    _wait_in_flight(rollout, 20)
    assert rollout.Abort(rollout_pb2.AbortRequest(request_id="target")).num_aborted == 16
    target.join(30)
    assert target.error is None and len(target.samples) == 16
    assert all(s.finish_reason == ABORT and 0 < len(s.response_token_ids) < LONG for s in target.samples)
    assert other.is_alive() and not other.samples  # another request_id keeps generating
    assert rollout.Abort(rollout_pb2.AbortRequest(request_id="other")).num_aborted == 4
    other.join(30)
    assert rollout.Abort(rollout_pb2.AbortRequest(request_id="target")).num_aborted == 0  # idempotent

    # Greedy: continuing the aborted sample for 5 more tokens gives what one uninterrupted run
    # of the same length gives, with the prefix's log-probs kept as they were.
    aborted = next(s for s in target.samples if s.group_index == 1)
    done = len(aborted.response_token_ids)
    prefix = rollout_pb2.ResponsePrefix(
        token_ids=aborted.response_token_ids, log_probs=aborted.rollout_log_probs
    )
    greedy = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=done + 5)
    continued = list(
        rollout.Generate(
            rollout_pb2.GenerateRequest(
                prompts=[rollout_pb2.Prompt(token_ids=[1, 9], response_prefix=prefix, group_index=1)],
                n_samples_per_prompt=1,
                sampling_params=greedy,
            )
        )
    )[0].sample
    whole = list(
        rollout.Generate(
            rollout_pb2.GenerateRequest(
                prompts=[rollout_pb2.Prompt(token_ids=[1, 9])], n_samples_per_prompt=1, sampling_params=greedy
            )
        )
    )[0].sample
    assert list(continued.prompt_token_ids) == [1, 9] and continued.group_index == 1
    assert (
        continued.response_token_ids == whole.response_token_ids and len(whole.response_token_ids) == done + 5
    )
    assert list(continued.rollout_log_probs[:done]) == list(aborted.rollout_log_probs)
    assert list(continued.rollout_log_probs[done:]) == pytest.approx(
        list(whole.rollout_log_probs[done:]), abs=1e-4
    )
    assert continued.finish_reason == common_pb2.FINISH_REASON_LENGTH


@pytest.mark.parametrize(
    ("prefix", "max_new_tokens", "field"),
    [
        (
            rollout_pb2.ResponsePrefix(token_ids=[5, 6], log_probs=[-1.0]),
            8,
            "prompts[0].response_prefix.log_probs",
        ),
        (
            rollout_pb2.ResponsePrefix(token_ids=[5, 6], log_probs=[-1.0, -1.0]),
            2,
            "prompts[0].response_prefix.token_ids",
        ),
        (
            rollout_pb2.ResponsePrefix(token_ids=[5, 10**6], log_probs=[-1.0, -1.0]),
            8,
            "prompts[0].response_prefix.token_ids[1]",
        ),
    ],
)
def test_bad_response_prefixes_and_aborts_are_refused(rollout, prefix, max_new_tokens, field):
    request = rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt(token_ids=[1, 9], response_prefix=prefix)],
        n_samples_per_prompt=1,
        sampling_params=common_pb2.SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens),
    )
    with pytest.raises(grpc.RpcError) as info:
        list(rollout.Generate(request))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details().startswith(field)
    with pytest.raises(grpc.RpcError) as empty:
        rollout.Abort(rollout_pb2.AbortRequest())
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT and empty.value.details().startswith(
        "request_id"
    )


def test_a_run_cannot_set_the_generate_queue_of_the_process(rollout):
    # The Generate queue is built once at start-up and shared by every run: a run's value would be
    # ignored, so it is refused naming the flag; the start-up value itself is accepted.
    config = struct_pb2.Struct()
    config.update({"generate_queue_size": 3})
    with pytest.raises(grpc.RpcError) as refused:
        rollout.Init(rollout_pb2.InitRequest(run_id="queue-settings", config=config))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.generate_queue_size" in refused.value.details()
    assert "--generate-queue-size" in refused.value.details()
    config.update({"generate_queue_size": 256})  # the default the service started with
    assert (
        rollout.Init(rollout_pb2.InitRequest(run_id="queue-settings", config=config)).run_id
        == "queue-settings"
    )
    rollout.EndRun(rollout_pb2.EndRunRequest(run_id="queue-settings"))
