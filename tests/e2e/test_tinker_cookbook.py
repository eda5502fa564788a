"""The calls the tinker-cookbook's RL and SL recipes (tinker-cookbook 0.6.1, rl/train.py,
supervised/train.py, checkpoint_utils.py) make through the unmodified SDK, each checked on values:
save_weights_and_get_sampling_client (and its async twin) samples the weights of that moment;
checkpoints as the SDK documents them (overwrite=False refuses, TTLs expire, delete, listings);
one error shape per kind of mistake; the model's context enforced and reported."""

from __future__ import annotations

import asyncio
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import tinker
from support.gateway import TOKEN, running_gateway
from support.waiting import wait_until
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


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gw")
    with running_gateway(workdir) as (base_url, _):
        yield base_url, workdir / "gateway"


@pytest.fixture(scope="module")
def service(gateway):
    client = tinker.ServiceClient(base_url=gateway[0], api_key=TOKEN, user_metadata={"recipe": "rl"})
    yield client
    client.close("success").result()


@pytest.fixture(scope="module")
def training(service, tiny_model_dir):
    return service.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()


def test_save_weights_and_get_sampling_client_samples_the_weights_of_that_moment(training, gateway):
    training.forward_backward(sft_data(), "cross_entropy")
    training.optim_step(ADAM).result()
    sampler = training.save_weights_and_get_sampling_client().result()  # the RL recipe's call
    prompt = [1, 40, 41]
    reply = sampler.sample(
        types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    ).result()
    sampled = reply.sequences[0]
    # The trainer's log-probs of the sampled tokens equal the sampler's: it serves these weights.
    tokens = prompt + list(sampled.tokens)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    trained = training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(trained[len(prompt) - 1 :], sampled.logprobs, atol=2e-3)
    # Its export is no checkpoint of the model's: not listed, no path to load.
    rest = tinker.RestClient(base_url=gateway[0], api_key=TOKEN)
    assert rest.list_checkpoints(training.model_id).result().checkpoints == []

    async def async_twin():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated in 0.38.0, still the cookbook's
            return await training.save_weights_and_get_sampling_client_async()

    twin = asyncio.run(async_twin())
    assert isinstance(twin, tinker.SamplingClient)
    assert twin.get_base_model() == training.get_info().model_data.model_name


def test_checkpoints_as_the_sdk_documents_them(service, training, gateway):
    base_url, workdir = gateway
    rest = service.create_rest_client()
    first = training.save_state("kept").result().path
    assert first == f"tinker://{training.model_id}/weights/kept"
    with pytest.raises(
        tinker.RequestFailedError, match=r"path: .*/weights/kept exists \(409 Conflict\)"
    ) as err:
        training.save_state("kept").result()  # the SDK's default overwrite=False
    assert err.value.category == types.RequestErrorCategory.User
    assert training.save_state("kept", overwrite=True).result().path == first

    short = training.save_state("short-lived", ttl_seconds=1).result().path
    listed = {c.tinker_path: c for c in rest.list_checkpoints(training.model_id).result().checkpoints}
    assert listed[short].expires_at is not None and listed[first].expires_at is None
    wait_until(
        lambda: short not in {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints},
        timeout=10,
        what="the expired checkpoint to go",
    )
    model_dir = workdir / training.model_id / "checkpoints"
    assert not (model_dir / "weights" / "short-lived").exists() and (model_dir / "weights" / "kept").is_dir()

    mine = rest.list_user_checkpoints(limit=10).result()
    assert [c.tinker_path for c in mine.checkpoints] == [first] and mine.cursor.total_count == 1
    rest.delete_checkpoint_from_tinker_path(first).result()  # the cookbook's rolling saves do this
    assert rest.list_checkpoints(training.model_id).result().checkpoints == []
    assert not (model_dir / "weights" / "kept").exists()
    with pytest.raises(tinker.NotFoundError, match="names no checkpoint"):
        rest.delete_checkpoint_from_tinker_path(first).result()

    session_id = service.holder.get_session_id()
    assert session_id in rest.list_sessions().result().sessions
    session = rest.get_session(session_id).result()
    assert training.model_id in session.training_run_ids and session.user_metadata == {"recipe": "rl"}
    # What checkpoint_utils reads back before resuming (the renderer name in user_metadata).
    assert rest.get_training_run_by_tinker_path(first).result().training_run_id == training.model_id


def test_one_error_shape_per_kind_of_mistake(training):
    data = sft_data()
    # The loss: unknown or refused, either way a 400 at once naming loss_fn.
    with pytest.raises(tinker.BadRequestError, match=r"loss_fn: 'kl' is not a loss of the tinker API"):
        training.forward_backward(data, "kl").result()  # type: ignore[arg-type]
    with pytest.raises(tinker.BadRequestError, match=r"loss_fn: gspo is refused"):
        training.forward_backward(data, "gspo").result()
    # A hyper-parameter's value: the trainer's check, a failed call naming the field (NaN included).
    for params, refusal in [
        (types.AdamParams(learning_rate=float("nan")), r"learning_rate: must be >= 0 \(got nan\)"),
        (types.AdamParams(beta2=1.0), r"beta2: must be in \[0, 1\) \(got 1.0\)"),
    ]:
        with pytest.raises(tinker.RequestFailedError, match=refusal) as err:
            training.optim_step(params).result()
        assert err.value.category == types.RequestErrorCategory.User and "AdamParams." not in str(err.value)
    # Another optimizer family: refused at once, naming it.
    with pytest.raises(
        tinker.BadRequestError, match=r"optimizer_params.type: 'dimuon' optimizer steps are not"
    ):
        training.optim_step(types.DimuonParams(learning_rate=0.01)).result()


def test_a_sequence_over_the_context_is_refused_naming_the_limit(gateway, training, tiny_model_dir):
    limit = json.loads((Path(tiny_model_dir) / "config.json").read_text())["max_position_embeddings"]
    capabilities = tinker.RestClient(base_url=gateway[0], api_key=TOKEN).get_server_capabilities().result()
    [model] = [
        m for m in capabilities.supported_models if m.model_name == str(Path(tiny_model_dir).resolve())
    ]
    assert model.max_context_length == limit
    tokens = [40 + k % 50 for k in range(limit + 2)]
    too_long = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    with pytest.raises(
        tinker.BadRequestError,
        match=re.escape(f"data[0].model_input: {limit + 1} tokens, over the model's context of {limit}"),
    ):
        training.forward_backward([too_long], "cross_entropy").result()
