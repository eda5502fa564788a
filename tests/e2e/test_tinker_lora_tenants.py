"""LoRA tenants of one base model share one trainer on `rollway gateway` (unmodified tinker SDK):
the base is loaded once (one trainer process for every LoRA model of that base and rank), and
each tenant's forward_backward and optim_step touch only its own adapters: four tenants whose
calls interleave end with the very same adapters, bit for bit, as each of them trained alone."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import tinker
import torch
from peft import PeftModel
from safetensors.torch import load_file
from support.gateway import TOKEN, post, resident_bytes, running_gateway
from support.processes import alive, descendants
from support.waiting import wait_until
from tinker import types
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow
RANK = 4
NUM_TENANTS = 4
NUM_STEPS = 3
ADAM = types.AdamParams(learning_rate=1e-2, eps=1e-8)


def tenant_data(k: int) -> list[types.Datum]:
    """Each tenant its own data: a tenant that saw another's would end elsewhere."""
    tokens = [[1, 40 + k, 41 + 2 * k, 50, 51 + k, 2], [1, 60 + 3 * k, 61, 62 + k, 63]]
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(t[:-1]),
            loss_fn_inputs={"target_tokens": t[1:], "weights": [1.0] * (len(t) - 1)},
        )
        for t in tokens
    ]


def logprobs(training, k: int) -> np.ndarray:
    out = training.forward(tenant_data(k), "cross_entropy").result()
    return np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])


def trainer_pids(gateway_pid: int) -> list[int]:
    return [pid for pid, cmd in descendants(gateway_pid).items() if "rollway.trainer" in cmd]


def saved_adapter(workdir, training, name: str) -> dict:
    """The peft adapter tensors of the tenant's save_state(name)."""
    [path] = (workdir / training.model_id / "checkpoints" / "weights" / name).glob(
        "iter_*/adapter/adapter_model.safetensors"
    )
    return load_file(str(path))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8))
    )


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gw")
    with running_gateway(workdir, "--max-models", str(2 * NUM_TENANTS + 1)) as (base_url, process):
        yield base_url, process, workdir / "gateway"


@pytest.fixture(scope="module")
def service(gateway):
    return tinker.ServiceClient(base_url=gateway[0], api_key=TOKEN)


@pytest.fixture(scope="module")
def alone(gateway, service, tiny_model_dir):
    """Tenants trained one after another, nothing in between: the reference. Also the trainer's
    resident memory with one LoRA tenant."""
    clients, one_tenant_rss = [], 0
    for k in range(NUM_TENANTS):
        training = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=RANK).result()
        if k == 0:
            [pid] = trainer_pids(gateway[1].pid)
            one_tenant_rss = resident_bytes(pid)
        for _ in range(NUM_STEPS):
            training.forward_backward(tenant_data(k), "cross_entropy").result()
            training.optim_step(ADAM).result()
        training.save_state("trained").result()
        clients.append(training)
    return clients, one_tenant_rss


@pytest.fixture(scope="module")
def interleaved(alone, service, tiny_model_dir):
    """The same tenants' work with every call in flight at once (the SDK's futures): each
    tenant's calls run in order on its own thread, the tenants' calls interleave in the trainer."""
    clients = [
        service.create_lora_training_client(base_model=str(tiny_model_dir), rank=RANK).result()
        for _ in range(NUM_TENANTS)
    ]
    futures = []
    for _ in range(NUM_STEPS):
        for k, training in enumerate(clients):
            futures.append(training.forward_backward(tenant_data(k), "cross_entropy"))
            futures.append(training.optim_step(ADAM))
    for future in futures:
        future.result(timeout=300)
    for training in clients:
        training.save_state("trained").result()
    return clients


def test_interleaved_tenants_end_with_the_adapters_each_had_alone(gateway, alone, interleaved):
    workdir = gateway[2]
    references, _ = alone
    for k, (reference, training) in enumerate(zip(references, interleaved, strict=True)):
        expected, got = (
            saved_adapter(workdir, reference, "trained"),
            saved_adapter(workdir, training, "trained"),
        )
        assert expected.keys() == got.keys() and expected
        for name in expected:  # bit for bit, not within a tolerance
            assert same_bits(expected[name], got[name]), (k, name)
        np.testing.assert_array_equal(logprobs(training, k), logprobs(reference, k))
    # The tenants trained on their own data: their adapters differ (B started at zero for all).
    first, second = (saved_adapter(workdir, t, "trained") for t in references[:2])
    assert any(not first[name].equal(second[name]) for name in first if ".lora_B." in name)


def transformers_log_probs(model, k: int) -> np.ndarray:
    values = []
    for datum in tenant_data(k):
        ids = torch.tensor([datum.model_input.to_ints()])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        targets = torch.tensor(datum.loss_fn_inputs["target_tokens"].tolist())
        values.append(logp[torch.arange(len(targets)), targets].numpy())
    return np.concatenate(values)


def test_a_tenants_save_is_its_own_peft_adapter_and_merged_export(gateway, interleaved, tiny_model_dir):
    workdir = gateway[2]
    training, k = interleaved[1], 1
    [saved] = (workdir / training.model_id / "checkpoints" / "weights" / "trained").glob("iter_*")
    served = logprobs(training, k)
    merged = AutoModelForCausalLM.from_pretrained(saved / "hf", dtype=torch.float32).eval()
    np.testing.assert_allclose(transformers_log_probs(merged, k), served, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert np.abs(transformers_log_probs(base.eval(), k) - served).max() > 1e-3  # it trained
    with_adapter = PeftModel.from_pretrained(base, saved / "adapter").eval()
    np.testing.assert_allclose(transformers_log_probs(with_adapter, k), served, atol=1e-5)


def test_a_tenants_sampling_client_samples_its_own_weights_whichever_tenant_ran_last(interleaved):
    """save_weights_and_get_sampling_client exports the tenant that asks, merged, even when
    another tenant's adapters were the live ones on the shared trainer."""
    first, second = interleaved[0], interleaved[1]
    own = logprobs(first, 0)
    logprobs(second, 0)  # tenant 1's adapters are now the live ones
    sampler = first.save_weights_and_get_sampling_client().result()
    start = 0
    for datum in tenant_data(0):
        targets = datum.loss_fn_inputs["target_tokens"].tolist()
        tokens = [*datum.model_input.to_ints(), targets[-1]]  # the row: its inputs and last target
        scored = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
        np.testing.assert_allclose(scored[1:], own[start : start + len(targets)], atol=2e-3)
        start += len(targets)
    assert np.abs(logprobs(second, 0) - own).max() > 1e-3  # the two tenants' weights differ


def test_the_base_model_is_loaded_once_for_every_lora_tenant(gateway, alone, interleaved):
    _, process, _ = gateway
    pids = trainer_pids(process.pid)
    assert len(pids) == 1, descendants(process.pid)  # 8 LoRA models, one trainer
    _, one_tenant_rss = alone
    # Eight tenants cost their adapters and AdamW state, not eight models and runtimes.
    assert resident_bytes(pids[0]) < 1.5 * one_tenant_rss
    runs = tinker.RestClient(base_url=gateway[0], api_key=TOKEN).list_training_runs().result()
    lora_runs = [r for r in runs.training_runs if r.is_lora and r.lora_rank == RANK]
    assert len(lora_runs) == 2 * NUM_TENANTS


def test_a_model_created_from_a_tenants_save_joins_the_shared_trainer(gateway, service, alone, interleaved):
    _, process, _ = gateway
    [pid] = trainer_pids(process.pid)
    references, _ = alone
    path = f"tinker://{interleaved[3].model_id}/weights/trained"
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert trainer_pids(process.pid) == [pid]
    np.testing.assert_array_equal(logprobs(resumed, 3), logprobs(references[3], 3))
    for training in (resumed, references[3]):  # the same next step: the AdamW state came along
        training.forward_backward(tenant_data(3), "cross_entropy").result()
        training.optim_step(ADAM).result()
    np.testing.assert_array_equal(logprobs(resumed, 3), logprobs(references[3], 3))
    status, _ = post(gateway[0], "/api/v1/unload_model", {"model_id": resumed.model_id}, TOKEN)
    assert status == 200


def test_a_killed_shared_trainer_comes_back_with_every_tenants_last_save(gateway, alone, interleaved):
    _, process, _ = gateway
    [pid] = trainer_pids(process.pid)
    references, _ = alone
    trained = interleaved[2]
    trained.forward_backward(tenant_data(2), "cross_entropy").result()
    trained.optim_step(ADAM).result()  # a step past its save: lost with the trainer
    os.kill(pid, signal.SIGSTOP)  # frozen: the next call is surely in flight when it dies
    in_flight = trained.forward_backward(tenant_data(2), "cross_entropy")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(tinker.RequestFailedError, match=r"died during this call; .* its last save"):
        in_flight.result(timeout=120)
    [new_pid] = trainer_pids(process.pid)
    assert new_pid != pid
    for k in (2, 3):  # each tenant back at its own last save, on the one new trainer
        np.testing.assert_array_equal(logprobs(interleaved[k], k), logprobs(references[k], k))


def test_a_released_tenant_leaves_the_others_and_the_last_one_stops_the_trainer(
    gateway, service, interleaved
):
    _, process, _ = gateway
    [pid] = trainer_pids(process.pid)
    before = logprobs(interleaved[1], 1)
    status, _ = post(gateway[0], "/api/v1/unload_model", {"model_id": interleaved[0].model_id}, TOKEN)
    assert status == 200  # released before the reply: its adapters dropped from the trainer
    np.testing.assert_array_equal(logprobs(interleaved[1], 1), before)  # untouched by the release
    assert trainer_pids(process.pid) == [pid]
    service.close("success").result()
    wait_until(lambda: not alive(pid), timeout=30, what="the shared trainer to stop with its last model")
