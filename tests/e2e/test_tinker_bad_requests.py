"""`rollway gateway` refuses bad requests in the tinker SDK's error shapes, naming what is wrong,
and keeps serving: a wrong key, a base model that is not a local model, a datum whose targets are
not its inputs shifted, an unsupported loss, AdamW settings out of range, an unknown model."""

from __future__ import annotations

import re

import psutil
import pytest
import tinker
from support.gateway import TOKEN, post, running_gateway
from support.processes import descendants
from tinker import types

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("gw")) as (base_url, process):
        yield base_url, process


@pytest.fixture(scope="module")
def training(gateway, tiny_model_dir):
    with tinker.ServiceClient(base_url=gateway[0], api_key=TOKEN) as client:  # closed: no stray heartbeats
        yield client.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()


def test_binds_loopback_and_refuses_a_wrong_key(gateway):
    base_url, process = gateway
    listening = [c.laddr.ip for c in psutil.Process(process.pid).net_connections() if c.status == "LISTEN"]
    assert listening == ["127.0.0.1"]
    status, body = post(base_url, "/api/v1/create_session", {}, "tml-wrong")
    assert (status, body) == (401, {"error": "X-API-Key: missing or wrong API key", "category": "user"})
    with pytest.raises(tinker.AuthenticationError):
        tinker.RestClient(base_url=base_url, api_key="tml-wrong").get_server_capabilities().result()


def test_a_base_model_that_is_not_a_local_model_is_named(gateway, tmp_path):
    with tinker.ServiceClient(base_url=gateway[0], api_key=TOKEN) as client:
        with pytest.raises(
            tinker.BadRequestError, match="base_model: .* is not a local Hugging Face model directory"
        ):
            client.create_lora_training_client(base_model=str(tmp_path), rank=0).result()


def test_bad_training_calls_fail_naming_the_field_and_the_model_keeps_training(training):
    shifted_wrong = types.Datum(
        model_input=types.ModelInput.from_ints([1, 40, 41]),
        loss_fn_inputs={"target_tokens": [40, 99, 50], "weights": [1.0, 1.0, 1.0]},
    )
    with pytest.raises(
        tinker.RequestFailedError, match=r"data\[0\].target_token_ids: must be the inputs shifted by one"
    ):
        training.forward_backward([shifted_wrong], "cross_entropy").result()
    with pytest.raises(tinker.BadRequestError, match="loss_fn: dro is refused"):
        training.forward_backward([shifted_wrong], "dro").result()
    with pytest.raises(tinker.BadRequestError, match="loss_fn: gspo is refused: its sequence-level ratio"):
        training.forward_backward([shifted_wrong], "gspo").result()
    with pytest.raises(tinker.RequestFailedError, match=r"beta2: must be in \[0, 1\) \(got 1.0\)"):
        training.optim_step(types.AdamParams(beta2=1.0)).result()
    good = types.Datum(
        model_input=types.ModelInput.from_ints([1, 40, 41]),
        loss_fn_inputs={"target_tokens": [40, 41, 50], "weights": [1.0, 1.0, 1.0]},
    )
    assert len(training.forward_backward([good], "cross_entropy").result().loss_fn_outputs) == 1


def test_an_unknown_model_is_not_found(gateway):
    status, body = post(gateway[0], "/api/v1/get_info", {"model_id": "no-such-model"}, TOKEN)
    assert status == 404 and body["error"].startswith(
        "model_id: 'no-such-model' is not a model of this gateway"
    )
    status, body = post(
        gateway[0], "/api/v1/optim_step", {"model_id": "m", "adam_params": {"learning_rate": "x"}}, TOKEN
    )
    assert status == 400 and "learning_rate" in body["error"]


def test_a_model_over_the_memory_budget_is_refused_before_anything_starts(tmp_path, tiny_model_dir):
    with running_gateway(tmp_path, "--memory-budget-gb", "0.001") as (base_url, process):
        _, session = post(
            base_url,
            "/api/v1/create_session",
            {"tags": [], "user_metadata": None, "sdk_version": "0.38.0"},
            TOKEN,
        )
        request = {"session_id": session["session_id"], "model_seq_id": 0, "base_model": str(tiny_model_dir)}
        status, body = post(base_url, "/api/v1/create_model", request, TOKEN)
        assert status == 429 and body["category"] == "server"
        assert re.match(
            r"base_model: training it needs about \d+ MiB \(estimated\) and 0 of the gateway's 1 MiB",
            body["error"],
        )
        assert not [cmd for cmd in descendants(process.pid).values() if "rollway.trainer" in cmd]
