"""Generate on a real rollout service (hf engine, tiny model): streaming order, groups, seeds,
log-probs against a teacher-forced forward, stop conditions, and bad input."""

from __future__ import annotations

import time

import grpc
import pytest
import torch
from support.processes import ServiceProcess
from transformers import AutoModelForCausalLM

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

STOP = common_pb2.FINISH_REASON_STOP
LENGTH = common_pb2.FINISH_REASON_LENGTH


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, tmp_path_factory):
    args = [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--max-running-requests",
        "64",
        "--max-samples-per-request",
        "64",
        "--reward",
        "none",
    ]
    with ServiceProcess("rollout", args, tmp_path_factory.mktemp("rollout")) as svc:
        yield rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _request(prompts, n=1, **sampling) -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(
        prompts=[
            p if isinstance(p, rollout_pb2.Prompt) else rollout_pb2.Prompt(token_ids=p) for p in prompts
        ],
        n_samples_per_prompt=n,
        sampling_params=common_pb2.SamplingParams(**sampling),
    )


def _generate(stub, request, timeout=120):
    return [r.sample for r in stub.Generate(request, timeout=timeout)]


def test_samples_stream_back_in_the_order_they_finish(rollout):
    # 16 samples of one prompt; ~25 stop tokens give each sample a different length.
    request = _request(
        [[1, 50, 60, 70]],
        n=16,
        temperature=1.0,
        max_new_tokens=400,
        seed=5,
        stop_token_ids=list(range(300, 325)),
    )
    start = time.monotonic()
    arrivals = []
    for reply in rollout.Generate(request, timeout=120):
        arrivals.append((time.monotonic() - start, reply.sample))
    lengths = [len(s.response_token_ids) for _, s in arrivals]
    assert sorted(s.index for _, s in arrivals) == list(range(16))
    assert lengths == sorted(lengths)  # one decode step per token: shorter samples finish first
    assert lengths[0] * 4 < lengths[-1]
    first, last = arrivals[0][0], arrivals[-1][0]
    assert first < 0.5 * last  # the first sample came long before the last one was done
    for _, sample in arrivals:
        assert sample.finish_reason == (LENGTH if len(sample.response_token_ids) == 400 else STOP)
        if sample.finish_reason == STOP:
            assert sample.response_token_ids[-1] in {*range(300, 325), 0, 2}  # stop ids or EOS


def test_n_samples_per_prompt_carry_group_index_and_prompt_fields(rollout):
    metadata = common_pb2.Sample().metadata.__class__()
    metadata.update({"id": 7, "tags": ["a"]})
    prompts = [
        rollout_pb2.Prompt(token_ids=[1, 9, 8], label="17", source="gsm", metadata=metadata),
        rollout_pb2.Prompt(token_ids=[1, 33], label="3", group_index=42),
        rollout_pb2.Prompt(token_ids=[1, 200, 201, 202], label="x"),
    ]
    samples = _generate(rollout, _request(prompts, n=4, temperature=1.0, max_new_tokens=12, seed=1))
    assert sorted(s.index for s in samples) == list(range(12))
    for sample in samples:
        p = sample.index // 4
        assert sample.group_index == [0, 42, 2][p]
        assert list(sample.prompt_token_ids) == list(prompts[p].token_ids)
        assert sample.label == prompts[p].label and sample.source == prompts[p].source
        assert len(sample.response_token_ids) == len(sample.rollout_log_probs) == len(sample.loss_mask)
        assert set(sample.loss_mask) == {1} and sample.weight_version == 0
        assert all(lp <= 0 for lp in sample.rollout_log_probs)
    assert dict(samples[[s.index for s in samples].index(0)].metadata) == {"id": 7.0, "tags": ["a"]}


def test_same_seed_same_samples(rollout):
    request = _request([[1, 50, 60], [1, 70]], n=3, temperature=1.0, max_new_tokens=20, seed=123)
    first = {
        s.index: (list(s.response_token_ids), list(s.rollout_log_probs)) for s in _generate(rollout, request)
    }
    again = {
        s.index: (list(s.response_token_ids), list(s.rollout_log_probs)) for s in _generate(rollout, request)
    }
    assert first == again
    request.sampling_params.seed = 124
    other = {s.index: list(s.response_token_ids) for s in _generate(rollout, request)}
    assert other != {i: tokens for i, (tokens, _) in first.items()}
    assert len({tuple(tokens) for tokens, _ in first.values()}) == 6  # seed + index: all samples differ


@pytest.mark.parametrize("temperature", [0.6, 1.0, 0.0])
def test_log_probs_equal_a_teacher_forced_forward(rollout, reference, temperature):
    request = _request([[1, 50, 60, 70], [1, 9]], n=2, temperature=temperature, max_new_tokens=30, seed=9)
    for sample in _generate(rollout, request):
        prompt, response = list(sample.prompt_token_ids), list(sample.response_token_ids)
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
        logits = logits / (temperature if temperature > 0 else 1.0)  # greedy: log-probs at temperature 1
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(list(sample.rollout_log_probs)), expected, atol=1e-4, rtol=0)
        if temperature == 0:
            assert response == logits.argmax(-1).tolist()


def test_stop_string_ends_the_response_before_it(rollout):
    free = _generate(rollout, _request([[1, 50, 60, 70]], temperature=0.0, max_new_tokens=30))[0]
    stop = free.response_text[12:15]
    assert len(stop) == 3
    stopped = _generate(
        rollout, _request([[1, 50, 60, 70]], temperature=0.0, max_new_tokens=30, stop=[stop])
    )[0]
    assert stopped.finish_reason == STOP
    assert (
        list(stopped.response_token_ids) == list(free.response_token_ids)[: len(stopped.response_token_ids)]
    )
    assert free.response_text.startswith(stopped.response_text) and stop not in stopped.response_text


def _expect_error(stub, request, code, field):
    with pytest.raises(grpc.RpcError) as info:
        _generate(stub, request)
    assert info.value.code() == code, info.value.details()
    assert info.value.details().startswith(field), info.value.details()


BAD = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "request_, code, field",
    [
        (rollout_pb2.GenerateRequest(), BAD, "prompts"),
        (_request([[1, 2], []]), BAD, "prompts[1].token_ids"),
        (_request([[1, 2, 400]]), BAD, "prompts[0].token_ids[2]"),
        (_request([[1, -3]]), BAD, "prompts[0].token_ids[1]"),
        (_request([[1, 2]], max_new_tokens=1023), BAD, "prompts[0].token_ids"),  # 2 + 1023 > 1024
        (_request([[1, 2]], temperature=-0.5), BAD, "sampling_params.temperature"),
        (_request([[1, 2]], top_p=1.5), BAD, "sampling_params.top_p"),
        (_request([[1, 2]], top_p=-0.1), BAD, "sampling_params.top_p"),
        (_request([[1, 2]], top_k=-2), BAD, "sampling_params.top_k"),
        (_request([[1, 2]], max_new_tokens=-1), BAD, "sampling_params.max_new_tokens"),
        (_request([[1, 2]], stop_token_ids=[5000]), BAD, "sampling_params.stop_token_ids[0]"),
        (_request([[1, 2]], stop=[""]), BAD, "sampling_params.stop[0]"),
        (_request([[1, 2]], seed=-1), BAD, "sampling_params.seed"),
        (_request([[1, 2]], n=-1), BAD, "n_samples_per_prompt"),
        (_request([[1, 2]] * 5, n=13), grpc.StatusCode.RESOURCE_EXHAUSTED, "n_samples_per_prompt"),
        (
            rollout_pb2.GenerateRequest(prompts=[rollout_pb2.Prompt(token_ids=[1])], reward="nope"),
            BAD,
            "reward",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field(rollout, request_, code, field):
    _expect_error(rollout, request_, code, field)


def test_service_keeps_serving_after_bad_input(rollout):
    _expect_error(rollout, _request([[1, 2, 999]]), BAD, "prompts[0].token_ids[2]")
    samples = _generate(rollout, _request([[1, 2]], n=2, temperature=1.0, max_new_tokens=5, seed=0))
    assert len(samples) == 2
    info = rollout.GetInfo(rollout_pb2.GetInfoRequest())
    assert info.engine == "hf" and info.vocab_size == 400 and info.max_context_len == 1024
    assert list(info.eos_token_ids) == [0, 2] and info.default_reward == "none" and not info.paused
