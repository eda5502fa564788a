"""A gateway killed with SIGKILL (its trainers with it) and started again on the same workdir and
port serves what was saved before: create_training_client_from_state continues from the saved
weights (the same log-probs), the sampler export is still known; the call in flight at the kill
fails with the SDK's typed error, not a plain ValueError."""

from __future__ import annotations

import os
import signal
import socket

import numpy as np
import pytest
import tinker
from support.gateway import TOKEN, post, running_gateway
from support.processes import descendants
from tinker import types

pytestmark = pytest.mark.slow
TOKENS = [[1, 40, 41, 50, 51, 52, 2], [1, 60, 61, 62, 63]]
ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-8)


def data() -> list[types.Datum]:
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(t[:-1]),
            loss_fn_inputs={"target_tokens": t[1:], "weights": [1.0] * (len(t) - 1)},
        )
        for t in TOKENS
    ]


def logprobs(training) -> np.ndarray:
    out = training.forward(data(), "cross_entropy").result()
    return np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_restarted_gateway_serves_what_was_saved_before(tmp_path, tiny_model_dir):
    port = ("--port", str(free_port()))  # the SDK's clients keep their base_url across the restart
    with running_gateway(tmp_path, *port) as (base_url, process):
        before = tinker.ServiceClient(base_url=base_url, api_key=TOKEN)
        training = before.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()
        training.forward_backward(data(), "cross_entropy")
        training.optim_step(ADAM).result()
        saved = logprobs(training)
        state = training.save_state("pre-kill").result().path
        sampler_path = training.save_weights_for_sampler("pre-kill").result().path
        [trainer] = [pid for pid, cmd in descendants(process.pid).items() if "rollway.trainer" in cmd]
        os.kill(trainer, signal.SIGSTOP)  # frozen: the calls below are surely in flight at the kill
        _, raw = post(
            base_url, "/api/v1/optim_step", {"model_id": training.model_id, "adam_params": {}}, TOKEN
        )
        in_flight = training.forward_backward(data(), "cross_entropy")
        process.kill()  # SIGKILL, its trainer with it

    with running_gateway(tmp_path, *port) as (base_url, _):
        status, body = post(base_url, "/api/v1/retrieve_future", {"request_id": raw["request_id"]}, TOKEN)
        assert status == 200 and "issued before the gateway restarted" in body["error"]
        # The SDK's call, repeated through the outage, ends in a typed error of the SDK's naming the
        # model's last save (the SDK may or may not have sent it before the kill).
        with pytest.raises((tinker.RequestFailedError, tinker.NotFoundError)) as lost:
            in_flight.result(timeout=120)
        assert "issued before the gateway restarted" in str(lost.value) or f"its last save is {state}" in str(
            lost.value
        )
        before.holder.close()  # its session went with the old gateway: stop its heartbeats

        with tinker.ServiceClient(base_url=base_url, api_key=TOKEN) as after:
            resumed = after.create_training_client_from_state_with_optimizer(state).result()
            np.testing.assert_allclose(logprobs(resumed), saved, atol=1e-6)
            resumed.forward_backward(data(), "cross_entropy")
            resumed.optim_step(ADAM).result()
            assert logprobs(resumed).sum() > saved.sum()  # it trains on from there
            rest = tinker.RestClient(base_url=base_url, api_key=TOKEN)
            listed = {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints}
            assert {state, sampler_path} <= listed
            assert rest.get_weights_info_by_tinker_path(sampler_path).result().base_model == str(
                tiny_model_dir.resolve()
            )
