"""Samplers on the live rollout: every sampling client of one base model is served by one rollout
service, which loads the weights each sample call names (an export, or the base model) before
generating (base_rollouts.py). Two exports of one training client sampled alternately each give
their own weights' samples; a new export's first sample costs a weight load, not a process; an
unused rollout service stops and the next sample starts it again. Unmodified SDK, tiny model."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tinker
from support.gateway import TOKEN, running_gateway
from support.processes import alive, descendants_running
from support.waiting import wait_until
from tinker import types

pytestmark = pytest.mark.slow
PROMPT = [1, 40, 41, 42]
SEEDED = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)  # same tokens for the same weights
IDLE_S = 8.0  # --sampler-idle-s: long enough for the alternating calls, short for the release test


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gw")
    with running_gateway(workdir, "--sampler-idle-s", str(IDLE_S)) as (base_url, process):
        yield base_url, process


@pytest.fixture(scope="module")
def service(gateway):
    client = tinker.ServiceClient(base_url=gateway[0], api_key=TOKEN)
    yield client
    client.close("success").result()


def rollout_pids(gateway) -> list[int]:
    return descendants_running(gateway[1].pid, "rollway.rollout")


def seeded(sampler: tinker.SamplingClient) -> tuple[list[int], np.ndarray]:
    sequence = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, SEEDED).result().sequences[0]
    return list(sequence.tokens), np.asarray(sequence.logprobs)


def train_step(training: tinker.TrainingClient, tokens: list[int]) -> None:
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=5e-2, eps=1e-8)).result()


def trainer_logprobs(
    training: tinker.TrainingClient, tokens: list[int], start: int = len(PROMPT)
) -> np.ndarray:
    """The trainer's log-probs of tokens[start:] (each given the tokens before it)."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    out = training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    return out[start - 1 :]


@pytest.fixture(scope="module")
def training(service, tiny_model_dir):
    return service.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()


def test_exports_share_one_rollout_and_each_samples_its_own_weights(
    service, training, gateway, tiny_model_dir
):
    base = service.create_sampling_client(base_model=str(tiny_model_dir)).result()
    started = time.perf_counter()
    base_first = seeded(base)
    print(
        f"first sample of the gateway's first sampler (rollout start): {time.perf_counter() - started:.2f} s"
    )

    # Export a, then train on and export b: each sampler's first sample is a weight load.
    fresh = {"base": base_first}
    samplers = {"base": base}
    for name, tokens in (("a", [1, 40, 41, 42, 60, 61, 62, 63]), ("b", [1, 40, 41, 42, 90, 91, 92, 93])):
        for _ in range(3):
            train_step(training, tokens)
        path = training.save_weights_for_sampler(name).result().path
        started = time.perf_counter()
        samplers[name] = service.create_sampling_client(model_path=path).result()
        fresh[name] = seeded(samplers[name])
        seconds = time.perf_counter() - started
        print(f"time to first sample of export {name} (create_sampling_client + sample): {seconds:.3f} s")
        assert seconds < 3.0, f"a new export's first sample took {seconds:.2f} s (a process start?)"
        # The trainer holds these weights now: its log-probs of the sampled tokens are the sampler's.
        np.testing.assert_allclose(
            trainer_logprobs(training, PROMPT + fresh[name][0]), fresh[name][1], atol=2e-3
        )
    # The three sets of weights differ, so a sampler on the wrong one would show.
    assert np.abs(fresh["a"][1] - fresh["b"][1]).max() > 1e-2 or fresh["a"][0] != fresh["b"][0]
    assert np.abs(fresh["a"][1] - fresh["base"][1]).max() > 1e-2 or fresh["a"][0] != fresh["base"][0]

    # Alternating calls switch weights every time, and every answer is that sampler's own.
    for name in ("a", "b", "base", "b", "a", "base", "a"):
        tokens, logprobs = seeded(samplers[name])
        assert tokens == fresh[name][0], name
        np.testing.assert_allclose(logprobs, fresh[name][1], atol=1e-5, err_msg=name)
    # Calls in flight at once on different exports are served one version at a time, never mixed.
    futures = [
        (name, samplers[name].sample(types.ModelInput.from_ints(PROMPT), 1, SEEDED))
        for name in ("a", "b", "a", "base", "b")
    ]
    for name, future in futures:
        sequence = future.result().sequences[0]
        assert list(sequence.tokens) == fresh[name][0], name
        np.testing.assert_allclose(sequence.logprobs, fresh[name][1], atol=1e-5, err_msg=name)

    # One rollout process served the base model and both exports.
    assert len(rollout_pids(gateway)) == 1


def test_compute_logprobs_equal_the_trainers(service, training):
    train_step(training, [1, 50, 51, 52, 53])
    sampler = training.save_weights_and_get_sampling_client().result()  # the trainer holds these weights
    tokens = [1, 40, 41, 42, 90, 91, 92, 93, 7]
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    assert len(scored) == len(tokens) and scored[0] is None  # the first token has no context
    np.testing.assert_allclose(scored[1:], trainer_logprobs(training, tokens, start=1), atol=2e-3)
    last = sampler.compute_logprobs(types.ModelInput.from_ints(tokens), prompt_logprobs_last_n=3).result()
    assert last[:-3] == [None] * (len(tokens) - 3)
    np.testing.assert_allclose(last[-3:], scored[-3:], atol=1e-5)


def test_unused_rollout_stops_and_starts_again(service, gateway, tiny_model_dir):
    sampler = service.create_sampling_client(base_model=str(tiny_model_dir)).result()
    before = seeded(sampler)
    [pid] = rollout_pids(gateway)
    wait_until(lambda: not alive(pid), timeout=IDLE_S + 20, what="the idle rollout service to stop")
    assert rollout_pids(gateway) == []
    tokens, logprobs = seeded(sampler)  # started again on demand
    assert tokens == before[0]
    np.testing.assert_allclose(logprobs, before[1], atol=1e-5)
    assert len(rollout_pids(gateway)) == 1
