"""More of the tinker SDK through `rollway gateway`, each checked on values: a LoRA client,
load_state back to a saved state, a custom loss (the SDK's client-side path), and ppo's
documented formula on the log-probs the gateway returns."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
import torch
from support.gateway import TOKEN, running_gateway
from tinker import types

pytestmark = pytest.mark.slow
TOKENS = [[1, 40, 41, 50, 51, 52, 2], [1, 60, 61, 62, 63]]
ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-8)


def sft_data() -> list[types.Datum]:
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(t[:-1]),
            loss_fn_inputs={"target_tokens": t[1:], "weights": [1.0] * (len(t) - 1)},
        )
        for t in TOKENS
    ]


def logprobs(training) -> np.ndarray:
    out = training.forward(sft_data(), "cross_entropy").result()
    return np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("gw"), "--max-models", "3") as (url, _):
        yield url


@pytest.fixture(scope="module")
def service(base_url):
    client = tinker.ServiceClient(base_url=base_url, api_key=TOKEN)
    yield client
    client.close("success").result()


@pytest.fixture(scope="module")
def full(service, tiny_model_dir):
    return service.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()


def test_a_lora_client_trains_its_adapters(service, tiny_model_dir):
    lora = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=4).result()
    info = lora.get_info()
    assert (info.is_lora, info.lora_rank) == (True, 4)
    before = logprobs(lora)
    for _ in range(2):  # LoRA's B starts at zero: the first step moves B only
        lora.forward_backward(sft_data(), "cross_entropy")
        lora.optim_step(ADAM).result()
    assert logprobs(lora).sum() > before.sum() + 0.01


def test_load_state_returns_to_the_saved_weights(full):
    full.forward_backward(sft_data(), "cross_entropy")
    full.optim_step(ADAM).result()
    path = full.save_state("checkpoint-a").result().path
    saved = logprobs(full)
    full.forward_backward(sft_data(), "cross_entropy")
    full.optim_step(ADAM).result()
    assert not np.allclose(logprobs(full), saved)
    full.load_state(path).result()
    np.testing.assert_allclose(logprobs(full), saved, atol=1e-6)


def test_a_custom_loss_runs_on_the_sdks_client_side_path(full):
    seen = []

    def negative_mean_logprob(data, logprobs_list):
        seen.append([lp.detach().clone() for lp in logprobs_list])
        loss = -torch.stack([lp.mean() for lp in logprobs_list]).sum()
        return loss, {"nll:mean": loss.item()}

    before = logprobs(full)
    result = full.forward_backward_custom(sft_data(), negative_mean_logprob).result()
    full.optim_step(ADAM).result()
    np.testing.assert_allclose(torch.cat(seen[0]).numpy(), before, atol=1e-5)  # the gateway's forward
    assert result.metrics["nll:mean"] == pytest.approx(-sum(lp.mean().item() for lp in seen[0]), abs=1e-4)
    assert logprobs(full).sum() > before.sum()


def test_ppo_through_the_gateway_is_the_documented_clipped_objective(full):
    sampling = [[-2.0 - 0.2 * i for i in range(len(t) - 1)] for t in TOKENS]
    advantages = [[1.0] * (len(TOKENS[0]) - 1), [-0.5] * (len(TOKENS[1]) - 1)]
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(t[:-1]),
            loss_fn_inputs={"target_tokens": t[1:], "logprobs": s, "advantages": a},
        )
        for t, s, a in zip(TOKENS, sampling, advantages, strict=True)
    ]
    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    out = full.forward(data, "ppo", config).result()
    total = 0.0
    for o, s, a in zip(out.loss_fn_outputs, sampling, advantages, strict=True):
        logp, s, a = o["logprobs"].to_numpy(), np.array(s), np.array(a)
        ratio = np.exp(logp - s)
        expected = -np.minimum(ratio * a, np.clip(ratio, 0.9, 1.1) * a)
        np.testing.assert_allclose(o["elementwise_loss"].to_numpy(), expected, rtol=1e-5, atol=1e-5)
        total += expected.sum()
    assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-4)


def test_a_new_session_resumes_from_a_saved_state(base_url, full):
    path = full.save_state("resume-point").result().path
    saved = logprobs(full)
    other = tinker.ServiceClient(base_url=base_url, api_key=TOKEN)
    try:
        resumed = other.create_training_client_from_state_with_optimizer(path).result()
        assert resumed.model_id != full.model_id
        np.testing.assert_allclose(logprobs(resumed), saved, atol=1e-6)
        resumed.forward_backward(sft_data(), "cross_entropy")
        resumed.optim_step(ADAM).result()
        assert logprobs(resumed).sum() > saved.sum()
    finally:
        other.close("success").result()
