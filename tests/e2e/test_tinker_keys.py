"""One API key per tenant (--tokens-file): a tenant sees only its own sessions, models, futures
and checkpoints; another tenant's ids answer 404 like unknown ones."""

from __future__ import annotations

import json

import pytest
import tinker
from support.gateway import post, running_gateway
from tinker import types

pytestmark = pytest.mark.slow
KEYS = {"alice": "tml-alice-key", "bob": "tml-bob-key"}


def test_tenants_see_only_their_own_models_futures_and_checkpoints(tmp_path, tiny_model_dir):
    tokens_file = tmp_path / "keys.json"
    tokens_file.write_text(json.dumps(KEYS))
    with running_gateway(tmp_path, "--tokens-file", str(tokens_file)) as (base_url, _):
        alice = tinker.ServiceClient(base_url=base_url, api_key=KEYS["alice"])
        bob = tinker.ServiceClient(base_url=base_url, api_key=KEYS["bob"])
        try:
            training = alice.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()
            path = training.save_state("mine").result().path

            status, issued = post(
                base_url,
                "/api/v1/optim_step",
                {"model_id": training.model_id, "adam_params": {}},
                KEYS["alice"],
            )
            assert status == 200
            # Another tenant's request id reads as an unknown one (a failed future, as after a restart).
            status, body = post(
                base_url, "/api/v1/retrieve_future", {"request_id": issued["request_id"]}, KEYS["bob"]
            )
            assert status == 200 and "is unknown to this gateway" in body["error"]
            status, body = post(
                base_url, "/api/v1/retrieve_future", {"request_id": issued["request_id"]}, KEYS["alice"]
            )
            assert status == 200 and body["type"] == "optim_step"
            status, body = post(base_url, "/api/v1/get_info", {"model_id": training.model_id}, KEYS["bob"])
            assert status == 404 and "is not a model of this gateway" in body["error"]

            bob_runs = tinker.RestClient(base_url=base_url, api_key=KEYS["bob"]).list_training_runs().result()
            assert bob_runs.training_runs == []
            alice_runs = (
                tinker.RestClient(base_url=base_url, api_key=KEYS["alice"]).list_training_runs().result()
            )
            assert [r.training_run_id for r in alice_runs.training_runs] == [training.model_id]
            with pytest.raises(tinker.NotFoundError, match="names no checkpoint of this gateway"):
                bob.create_training_client_from_state(path).result()
            assert (
                training.forward_backward(
                    [
                        types.Datum(
                            model_input=types.ModelInput.from_ints([1, 2]),
                            loss_fn_inputs={"target_tokens": [2, 3]},
                        )
                    ],
                    "cross_entropy",
                )
                .result()
                .metrics["num_datums:sum"]
                == 1.0
            )
        finally:
            alice.close("success").result()
            bob.close("success").result()
