"""ForwardBackward and OptimStep (the Tinker API's split step) on a real `python -m rollway.trainer`.

The losses are checked against formulas written here on log-probs computed here with plain
transformers; gradients accumulate across calls until OptimStep applies them.
"""

from __future__ import annotations

import grpc
import pytest
import torch
from support.processes import ServiceProcess
from transformers import AutoModelForCausalLM

from rollway.common.client import open_channel
from rollway.trainer.v1 import trainer_pb2 as pb
from rollway.trainer.v1 import trainer_pb2_grpc

pytestmark = pytest.mark.slow
SEQUENCES = [[1, 40, 41, 50, 51, 52, 2], [1, 60, 61, 62], [1, 70, 71, 72, 73]]
ADAM = {"learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}


@pytest.fixture(scope="module")
def stub(tiny_model_dir, tmp_path_factory):
    args = ["--hf-checkpoint", str(tiny_model_dir), "--world-size", "1", "--dtype", "float32"]
    with ServiceProcess("trainer", args, tmp_path_factory.mktemp("trainer")) as svc:
        with open_channel(svc.address) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            stub.Init(pb.InitRequest(run_id="split-step"))
            yield stub


@pytest.fixture(scope="module")
def reference_log_probs(tiny_model_dir) -> list[torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for tokens in SEQUENCES:
            logits = model(torch.tensor([tokens[:-1]])).logits[0].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0])
    return out


def datum(tokens: list[int], k: int, **per_token) -> pb.Datum:
    n = len(tokens) - 1
    values = {name: fn(k, n) for name, fn in per_token.items()}
    return pb.Datum(token_ids=tokens[:-1], target_token_ids=tokens[1:], **values)


def rl_batch() -> list[pb.Datum]:
    return [
        datum(
            t,
            k,
            sampling_log_probs=lambda k, n: [-1.0 - 0.3 * k - 0.1 * i for i in range(n)],
            advantages=lambda k, n: [(-1.0) ** k * (0.5 + 0.1 * i) for i in range(n)],
        )
        for k, t in enumerate(SEQUENCES)
    ]


def checksum(stub) -> str:
    return stub.WeightChecksum(pb.WeightChecksumRequest(dtype="float32")).checksum.digest


def reference_terms(loss_fn: str, logp, d: pb.Datum, low=0.8, high=1.2) -> torch.Tensor:
    """The Tinker documentation's per-token formulas, written out."""
    if loss_fn == "cross_entropy":
        return -torch.tensor(list(d.weights)) * logp
    ratio = torch.exp(logp - torch.tensor(list(d.sampling_log_probs)))
    adv = torch.tensor(list(d.advantages))
    if loss_fn == "importance_sampling":
        return -ratio * adv
    if loss_fn == "ppo":
        return -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    return -ratio.clamp(low, high) * logp * adv  # cispo (the clipped ratio carries no gradient)


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo"])
def test_forward_only_gives_the_documented_loss_on_transformers_log_probs(stub, reference_log_probs, loss_fn):
    if loss_fn == "cross_entropy":
        data = [
            datum(t, k, weights=lambda k, n: [float(i % 2) for i in range(n)])
            for k, t in enumerate(SEQUENCES)
        ]
    else:
        data = rl_batch()
    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1} if loss_fn in ("ppo", "cispo") else {}
    before = checksum(stub)
    out = stub.ForwardBackward(
        pb.ForwardBackwardRequest(loss_fn=loss_fn, forward_only=True, data=data, loss_fn_config=config)
    )
    assert len(out.outputs) == len(SEQUENCES)
    total = 0.0
    for d, o, logp in zip(data, out.outputs, reference_log_probs, strict=True):
        torch.testing.assert_close(torch.tensor(list(o.log_probs)), logp, atol=1e-5, rtol=0)
        expected = reference_terms(loss_fn, logp, d, *(config.values() or (0.8, 1.2)))
        torch.testing.assert_close(torch.tensor(list(o.elementwise_loss)), expected, atol=1e-5, rtol=1e-5)
        total += float(expected.sum())
    assert out.metrics["loss:sum"] == pytest.approx(total, abs=1e-4)
    assert out.metrics["num_tokens"] == sum(len(t) - 1 for t in SEQUENCES)
    assert checksum(stub) == before  # forward only: nothing to apply


def test_gradients_accumulate_until_optim_step_and_lower_the_loss(stub):
    data = [datum(t, k, weights=lambda k, n: [1.0] * n) for k, t in enumerate(SEQUENCES)]

    def loss(forward_only: bool, part=slice(None)) -> float:
        request = pb.ForwardBackwardRequest(
            loss_fn="cross_entropy", forward_only=forward_only, data=data[part]
        )
        return stub.ForwardBackward(request).metrics["loss:sum"]

    start = checksum(stub)
    empty = stub.OptimStep(pb.OptimStepRequest(**ADAM))
    assert checksum(stub) == start  # no accumulated gradient: no change
    first = loss(True)
    loss(False, slice(0, 1))
    loss(False, slice(1, None))
    assert checksum(stub) == start  # gradients wait for OptimStep
    step = stub.OptimStep(pb.OptimStepRequest(**ADAM))
    assert step.global_step == empty.global_step + 1
    assert step.metrics["train/grad_norm"] > 0 and step.metrics["train/lr"] == ADAM["learning_rate"]
    assert loss(True) < first - 0.1


@pytest.mark.parametrize(
    ("request_kwargs", "fragment"),
    [
        ({"loss_fn": "dro"}, "loss_fn: unknown loss 'dro'"),
        (
            {"data": [pb.Datum(token_ids=[1, 2, 3], target_token_ids=[2, 4, 5], weights=[1, 1, 1])]},
            "data[0].target_token_ids: must be the inputs shifted by one: target 1 is 4, input 2 is 3",
        ),
        (
            {"data": [pb.Datum(token_ids=[1, 2], target_token_ids=[2, 3], weights=[1])]},
            "data[0].weights: has 1 entries for 2 targets",
        ),
        (
            {"data": [pb.Datum(token_ids=[1, 10**7], target_token_ids=[10**7, 3], weights=[1, 1])]},
            "data[0].token_ids: token id 10000000 is outside the vocabulary",
        ),
        ({"data": []}, "data: empty batch"),
        (
            {"loss_fn_config": {"clip_low_threshold": 0.5}},
            "loss_fn_config.clip_low_threshold: cross_entropy takes no such setting",
        ),
        ({"adapter": "s:train:1"}, "adapter: this trainer trains no LoRA adapters (lora_rank 0)"),
    ],
)
def test_bad_forward_backward_requests_name_the_field(stub, request_kwargs, fragment):
    request = {
        "loss_fn": "cross_entropy",
        "data": [pb.Datum(token_ids=[1, 2], target_token_ids=[2, 3], weights=[1, 1])],
    }
    with pytest.raises(grpc.RpcError) as err:
        stub.ForwardBackward(pb.ForwardBackwardRequest(**{**request, **request_kwargs}))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in err.value.details()


def test_bad_adam_settings_name_the_field(stub):
    with pytest.raises(grpc.RpcError) as err:
        stub.OptimStep(pb.OptimStepRequest(**{**ADAM, "beta2": 1.0}))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "beta2: must be in [0, 1) (got 1.0)" in err.value.details()
