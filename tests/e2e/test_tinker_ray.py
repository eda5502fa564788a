"""`rollway gateway --launcher ray`: each model's trainer is a Ray actor (the coordinator's
RayServiceGroup, as a run's `launcher: ray`) on a local Ray cluster; the unmodified tinker SDK
trains through it, and a trainer killed under its actor is restarted as a new actor from the
model's last saved state."""

from __future__ import annotations

import json
import os
import re
import signal

import numpy as np
import pytest
import tinker
from support.gateway import TOKEN, running_gateway
from support.processes import alive, descendants
from support.waiting import wait_until
from tinker import types

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-8)
TOKENS = [[1, 40, 41, 50, 51, 52, 2], [1, 60, 61, 62, 63]]


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster with 4 logical CPUs, which the gateway joins (RAY_ADDRESS)."""
    previous = os.environ.get("RAY_ADDRESS")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    try:
        yield os.environ["RAY_ADDRESS"]
    finally:
        ray.shutdown()
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous


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


def trainer_actor(workdir, model_id: str) -> dict:
    """Where the model's trainer runs, as its RayServiceGroup wrote it (ray.json)."""
    actors = json.loads((workdir / "gateway" / model_id / "services" / "ray.json").read_text())["actors"]
    assert list(actors) == ["trainer-0"], actors  # one rank, one actor
    return actors["trainer-0"]


def actor_exists(name: str) -> bool:
    try:
        ray.get_actor(name, namespace="rollway")
        return True
    except ValueError:
        return False


def test_sft_through_the_sdk_on_a_ray_actor_trainer_which_restarts_after_a_kill(
    tmp_path, tiny_model_dir, ray_cluster
):
    with running_gateway(tmp_path, "--launcher", "ray") as (base_url, process):
        service = tinker.ServiceClient(base_url=base_url, api_key=TOKEN)
        training = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()
        actor_name = f"rollway-{training.model_id}-trainer-0"
        assert actor_exists(actor_name)
        first = trainer_actor(tmp_path, training.model_id)
        # The trainer is the Ray actor's process, not the gateway's.
        assert alive(first["pid"]) and first["pid"] not in descendants(process.pid)
        assert not [cmd for cmd in descendants(process.pid).values() if "rollway.trainer" in cmd]

        losses = []
        for _ in range(4):
            fwd_bwd = training.forward_backward(data(), "cross_entropy")
            training.optim_step(ADAM).result()
            losses.append(fwd_bwd.result().metrics["loss:sum"])
        print("SFT loss per step:", [round(x, 3) for x in losses])
        assert losses[-1] < losses[0] - 1.0, losses

        saved = logprobs(training)
        training.save_state("before-kill").result()
        training.forward_backward(data(), "cross_entropy").result()
        training.optim_step(ADAM).result()
        assert not np.allclose(logprobs(training), saved)  # trained past the save

        os.kill(first["pid"], signal.SIGSTOP)  # frozen: the next call is surely in flight when it dies
        in_flight = training.forward_backward(data(), "cross_entropy")
        os.kill(first["pid"], signal.SIGKILL)
        with pytest.raises(tinker.RequestFailedError) as lost:
            in_flight.result(timeout=120)
        assert lost.value.category == types.RequestErrorCategory.Server
        assert re.search(
            rf"the trainer of {re.escape(training.model_id)} died during this call; it was restarted and loaded "
            rf"its last save tinker://{re.escape(training.model_id)}/weights/before-kill \(saved [-0-9T:+]+\); "
            "the steps after that save are lost",
            str(lost.value),
        )
        second = trainer_actor(tmp_path, training.model_id)
        assert second["generation"] == 1 and second["pid"] != first["pid"] and alive(second["pid"])
        np.testing.assert_allclose(logprobs(training), saved, atol=1e-6)  # the saved state

        service.close("success").result()  # releases the model: its actor goes
        wait_until(lambda: not actor_exists(actor_name), timeout=60, what="the trainer's actor to go")
        assert not alive(second["pid"])
