"""Several LoRA tenants on one base model: the base weights once, each tenant's adapters, AdamW
state, gradients and step its own.

    request(adapter=T) -> controller (one lock) -> ActivateAdapter(T) on every rank -> the command

The model keeps ONE peft adapter ("default", lora.py); a tenant's values live in it only while
that tenant's call runs. Activating T copies the live adapters out into the tenant that had
them and T's in, and hands over the optimizer state, the gradients and the step counter by
reference. Why not one peft adapter per tenant (inject_adapter_in_model(adapter_name=T)):
tenants arrive after FSDP2 has grouped the parameters (fully_shard runs once, at load) and the
fused AdamW holds a fixed parameter list; swapping the values keeps both as they are, works on
every rank's shard alike, and is exact (a copy), so a tenant's numbers never depend on who ran
in between.

A tenant named for the first time starts from the adapters the trainer loaded (A from --seed,
B zero: the base model's outputs), snapshotted when the first tenant is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rollway.trainer.lora import is_adapter_name

OWN = ""  # the trainer's own adapters (a single-tenant run never names a tenant)


@dataclass
class TenantState:
    """A tenant's adapters while another tenant's are live."""

    values: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    optimizer_state: dict[torch.nn.Parameter, dict] = field(default_factory=dict)
    global_step: int = 0


class LoraTenants:
    """Which tenant's adapters the model holds, and every other tenant's, stored aside."""

    def __init__(self, model: torch.nn.Module):
        self.params = {name: p for name, p in model.named_parameters() if is_adapter_name(name)}
        self.active = OWN
        self.stored: dict[str, TenantState] = {}
        self._initial: dict[str, torch.Tensor] | None = None

    @property
    def names(self) -> set[str]:
        return {self.active, *self.stored} - {OWN}

    def activate(self, name: str, optimizer: torch.optim.Optimizer | None, global_step: int) -> int:
        """Make `name`'s adapters the live ones; returns its step (the engine's global_step)."""
        if name == self.active:
            return global_step
        if self._initial is None:  # before any tenant trained: what a new tenant starts from
            self._initial = self._copy_values()
        self.stored[self.active] = self._take_out(optimizer, global_step)
        incoming = self.stored.pop(name, None) or TenantState(values=self._initial)
        self._put_in(incoming, optimizer)
        self.active = name
        return incoming.global_step

    def drop(self, name: str, optimizer: torch.optim.Optimizer | None, global_step: int) -> tuple[bool, int]:
        """Forget `name` (True if held); the live adapters become the trainer's own. Returns
        (was_held, the live tenant's step)."""
        if name == OWN:
            return False, global_step
        if name == self.active:
            global_step = self.activate(OWN, optimizer, global_step)
        return self.stored.pop(name, None) is not None, global_step

    # --- internals ------------------------------------------------------------------------
    def _copy_values(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.params.items()}

    def _take_out(self, optimizer: torch.optim.Optimizer | None, global_step: int) -> TenantState:
        state = TenantState(values=self._copy_values(), global_step=global_step)
        for name, p in self.params.items():
            state.grads[name], p.grad = p.grad, None
            if optimizer is not None and p in optimizer.state:
                state.optimizer_state[p] = optimizer.state.pop(p)
        return state

    def _put_in(self, state: TenantState, optimizer: torch.optim.Optimizer | None) -> None:
        # In place: FSDP2 all-gathers from the sharded parameters' own storage.
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(state.values[name])
                p.grad = state.grads.get(name)
        if optimizer is not None:
            optimizer.state.update(state.optimizer_state)
