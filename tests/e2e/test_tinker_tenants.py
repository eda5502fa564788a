"""Several tenants on one `rollway gateway`, driven by the unmodified tinker SDK: two clients
training at once stay isolated; a client whose heartbeats stop loses its models; a tenant's
trainer killed with SIGKILL is restarted from that tenant's last saved state, its call in flight
fails with an error saying that the trainer died, was restarted, and from which save, and the other tenant never notices."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tinker
from support.gateway import TOKEN, running_gateway
from support.processes import alive, descendants
from support.waiting import wait_until
from tinker import types

pytestmark = pytest.mark.slow
SESSION_TIMEOUT_S = 15  # the SDK heartbeats every 10 s
ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-8)
TOKENS = [[1, 40, 41, 50, 51, 52, 2], [1, 60, 61, 62, 63]]


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


def trainer_pid(gateway_pid: int, model_id: str) -> int:
    pids = [
        pid
        for pid, cmd in descendants(gateway_pid).items()
        if "rollway.trainer" in cmd and f"/{model_id}/" in cmd
    ]
    assert len(pids) == 1, descendants(gateway_pid)
    return pids[0]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    flags = ("--session-timeout-s", str(SESSION_TIMEOUT_S), "--max-models", "3")
    with running_gateway(tmp_path_factory.mktemp("gw"), *flags) as (base_url, process):
        yield base_url, process


@pytest.fixture(scope="module")
def service_clients(gateway):
    return [tinker.ServiceClient(base_url=gateway[0], api_key=TOKEN) for _ in range(2)]


@pytest.fixture(scope="module")
def two_clients(service_clients, tiny_model_dir):
    return [
        c.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()
        for c in service_clients
    ]


def test_two_clients_have_their_own_weights_gradients_and_optimizer(gateway, two_clients, silenced_session):
    a, b = two_clients
    assert a.model_id != b.model_id
    base_a, base_b = logprobs(a), logprobs(b)
    np.testing.assert_array_equal(base_a, base_b)  # the same base model
    a.forward_backward(data(), "cross_entropy").result()  # A's gradients wait for A's optim_step
    b.optim_step(ADAM).result()  # B has no gradient: B does not move, and A's are not B's
    np.testing.assert_array_equal(logprobs(b), base_b)
    a.optim_step(ADAM).result()
    assert logprobs(a).sum() > base_a.sum() + 0.1  # A learned its data
    np.testing.assert_array_equal(logprobs(b), base_b)  # B did not
    runs = {
        r.training_run_id
        for r in tinker.RestClient(base_url=gateway[0], api_key=TOKEN)
        .list_training_runs()
        .result()
        .training_runs
    }
    assert {a.model_id, b.model_id} <= runs


def test_a_killed_trainer_restarts_from_its_tenants_last_save_and_the_call_in_flight_is_retryable(
    gateway, two_clients
):
    _, process = gateway
    a, b = two_clients
    a.forward_backward(data(), "cross_entropy").result()
    a.optim_step(ADAM).result()
    saved = logprobs(a)
    a.save_state("before-kill").result()
    a.forward_backward(data(), "cross_entropy").result()
    a.optim_step(ADAM).result()
    assert not np.allclose(logprobs(a), saved)  # trained past the save
    b_before, b_pid = logprobs(b), trainer_pid(process.pid, b.model_id)

    pid = trainer_pid(process.pid, a.model_id)
    os.kill(pid, signal.SIGSTOP)  # frozen: the next call is surely in flight when it dies
    in_flight = a.forward_backward(data(), "cross_entropy")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(tinker.RequestFailedError) as lost:
        in_flight.result(timeout=120)
    # The error says what happened and what was kept: the steps since the save are gone.
    assert lost.value.category == types.RequestErrorCategory.Server
    assert re.search(
        rf"the trainer of {re.escape(a.model_id)} died during this call; it was restarted and loaded "
        rf"its last save tinker://{re.escape(a.model_id)}/weights/before-kill \(saved [-0-9T:+]+\); "
        "the steps after that save are lost",
        str(lost.value),
    )

    new_pid = trainer_pid(process.pid, a.model_id)
    assert new_pid != pid and not alive(pid)
    np.testing.assert_allclose(logprobs(a), saved, atol=1e-6)  # the saved state, not the later step
    assert trainer_pid(process.pid, b.model_id) == b_pid
    np.testing.assert_array_equal(logprobs(b), b_before)


CLIENT = """
import sys, time, tinker
client = tinker.ServiceClient(base_url=sys.argv[1], api_key=sys.argv[2])
training = client.create_lora_training_client(base_model=sys.argv[3], rank=0).result()
print(training.model_id, flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def silenced_session(gateway, tiny_model_dir):
    """A client process that made a model, then was SIGKILLed (no goodbye, the heartbeats just
    stop); (its model id, its trainer's pid). The first test asks for it, so that the session's
    timeout runs out while the other tests run rather than on its own."""
    base_url, process = gateway
    client = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CLIENT), base_url, TOKEN, str(tiny_model_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        model_id = client.stdout.readline().strip()
        assert model_id, "the client process printed no model id"
        pid = trainer_pid(process.pid, model_id)
    finally:
        client.kill()
        client.wait(timeout=10)
    return model_id, pid


def test_a_session_without_heartbeats_releases_its_trainer(gateway, two_clients, silenced_session):
    model_id, pid = silenced_session
    wait_until(
        lambda: not alive(pid), timeout=SESSION_TIMEOUT_S + 15, what="the silent session's trainer to stop"
    )
    rest = tinker.RestClient(base_url=gateway[0], api_key=TOKEN)
    runs = {r.training_run_id for r in rest.list_training_runs().result().training_runs}
    assert model_id not in runs
    assert {m.model_id for m in two_clients} <= runs  # the live clients keep theirs


def test_closing_a_client_releases_its_trainers(gateway, service_clients, two_clients):
    pids = [trainer_pid(gateway[1].pid, t.model_id) for t in two_clients]
    for client in service_clients:
        client.close("success").result()
    wait_until(
        lambda: not any(alive(pid) for pid in pids), timeout=30, what="the closed sessions' trainers to stop"
    )
