"""LoRA tenants on one model (trainer/lora_tenants.py): a tenant's steps give the same adapters
whether other tenants' steps ran in between or not; a new tenant starts from the adapters the model
was loaded with; a dropped tenant is gone and the base weights never move. A real peft-wrapped
module and the trainer's fused AdamW (no FSDP here: the e2e test runs the sharded trainer)."""

from __future__ import annotations

import torch
from peft import LoraConfig, inject_adapter_in_model

from rollway.trainer.lora_tenants import LoraTenants


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(6, 12)
        self.down = torch.nn.Linear(12, 6)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def lora_block() -> torch.nn.Module:
    torch.manual_seed(0)
    model = inject_adapter_in_model(
        LoraConfig(r=2, target_modules=["up", "down"], init_lora_weights=False), Block()
    )
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def optimizer_of(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, fused=True)


def step(model, optimizer, seed: int) -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
    model(x).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def adapters(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}


def alone(seed: int, num_steps: int) -> dict[str, torch.Tensor]:
    model = lora_block()
    optimizer = optimizer_of(model)
    for k in range(num_steps):
        step(model, optimizer, seed + k)
    return adapters(model)


def test_interleaved_tenants_end_bit_for_bit_where_each_ends_alone():
    model = lora_block()
    base = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" not in n}
    optimizer = optimizer_of(model)
    tenants = LoraTenants(model)
    global_step = 0
    for k in range(3):
        for name, seed in (("a", 10), ("b", 20), ("c", 30)):
            global_step = tenants.activate(name, optimizer, global_step)
            step(model, optimizer, seed + k)  # AdamW's moments carry over: a mixed state would show
            global_step += 1
    for name, seed in (("a", 10), ("b", 20), ("c", 30)):
        global_step = tenants.activate(name, optimizer, global_step)
        assert global_step == 3
        expected = alone(seed, 3)
        for key, value in adapters(model).items():
            assert torch.equal(value, expected[key]), (name, key)
    for key, value in base.items():  # the frozen base is shared and untouched
        assert torch.equal(dict(model.named_parameters())[key], value)


def test_gradients_wait_for_their_tenants_optim_step():
    model = lora_block()
    optimizer = optimizer_of(model)
    tenants = LoraTenants(model)
    tenants.activate("a", optimizer, 0)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    model(x).pow(2).sum().backward()  # a's forward_backward, no optim_step yet
    a_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    tenants.activate("b", optimizer, 0)
    assert all(p.grad is None for p in model.parameters())  # b sees none of a's gradients
    tenants.activate("a", optimizer, 0)
    assert {n: p.grad for n, p in model.named_parameters() if p.grad is not None}.keys() == a_grads.keys()
    assert all(torch.equal(p.grad, a_grads[n]) for n, p in model.named_parameters() if p.grad is not None)


def test_a_new_tenant_starts_from_the_loaded_adapters_and_a_dropped_one_is_gone():
    model = lora_block()
    loaded = adapters(model)
    optimizer = optimizer_of(model)
    tenants = LoraTenants(model)
    tenants.activate("a", optimizer, 0)
    step(model, optimizer, 5)
    tenants.activate("b", optimizer, 1)
    assert all(torch.equal(v, loaded[k]) for k, v in adapters(model).items())
    assert not any(p in optimizer.state for p in model.parameters())  # no AdamW state of a's
    assert tenants.names == {"a", "b"}
    assert tenants.drop("a", optimizer, 0) == (True, 0)
    assert tenants.names == {"b"}
    assert tenants.drop("a", optimizer, 0) == (False, 0)
    tenants.activate("a", optimizer, 0)  # named again: a new tenant, from the loaded adapters
    assert all(torch.equal(v, loaded[k]) for k, v in adapters(model).items())
