"""The models the gateway trains: created in a session (admitted against --max-models and the
memory budget, memory.py), found for their owner, their calls queued on their own thread in
arrival order (futures.py), and released.

A full fine-tuning model gets a trainer of its own; LoRA models of one base model and rank share
one (with --share-lora-base), each as a named adapter of it (tenants.py).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from rollway.coordinator.plan.host import available_memory
from rollway.gateway.callers import owns
from rollway.gateway.checkpoints import CheckpointStore, TenantSpec
from rollway.gateway.config import GatewayConfig
from rollway.gateway.errors import GatewayError, bad_request, not_found
from rollway.gateway.futures import FutureStore
from rollway.gateway.memory import adapter_bytes, max_context_length, trainer_bytes
from rollway.gateway.sessions import SessionTable
from rollway.gateway.tenants import Tenant, Trainer
from rollway.gateway.wire import ForwardBackwardCall, encode_forward_backward_output
from rollway.trainer.v1 import trainer_pb2

MIB = 2**20


def user_error(exc: grpc.RpcError) -> GatewayError:
    """A trainer's refusal (INVALID_ARGUMENT names the field) as the SDK's user error."""
    return GatewayError(400, exc.details() or str(exc.code()))


class ModelTable:
    """model id -> Tenant, and the trainers LoRA models share."""

    def __init__(
        self, config: GatewayConfig, sessions: SessionTable, saved: CheckpointStore, futures: FutureStore
    ):
        self.config = config
        self.workdir = Path(config.workdir).resolve()
        self.sessions = sessions
        self.saved = saved  # for the last save a released model's caller may continue from
        self.futures = futures
        # What `rollway run` reads too (MemAvailable: free pages leave out the reclaimable cache).
        self.memory_budget = int(config.memory_budget_gb * 2**30) or available_memory()
        self.tenants: dict[str, Tenant] = {}
        # The trainers LoRA models share, by (base model directory, LoRA rank).
        self.shared_trainers: dict[tuple[str, int], Trainer] = {}
        self._lock = threading.Lock()

    # --- lookup ----------------------------------------------------------------------------
    def get(self, model_id: str) -> Tenant:
        """A live model of the caller's (not_found otherwise, naming its last save if released)."""
        tenant = self.tenants.get(model_id)
        if tenant is None or not owns(tenant.spec.owner):
            saves = (
                [c for c in self.saved.of_model(model_id) if c.kind == "weights"] if tenant is None else []
            )
            if saves and owns(self.saved.get(saves[-1].tinker_path)[1].owner):
                raise not_found(
                    f"model_id: {model_id!r} is no longer served (released, or lost with a gateway restart); "
                    f"its last save is {saves[-1].tinker_path}: continue with "
                    "create_training_client_from_state_with_optimizer of it"
                )
            raise not_found(
                f"model_id: {model_id!r} is not a model of this gateway (released or never created)"
            )
        return tenant

    def find(self, model_id: str) -> Tenant | None:
        """The live model of that id, whoever owns it (None: not served)."""
        return self.tenants.get(model_id)

    def all(self) -> list[Tenant]:
        """Every live model, every owner's."""
        with self._lock:
            return list(self.tenants.values())

    # --- creation --------------------------------------------------------------------------
    def create_model(self, body: dict[str, Any]) -> str:
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise bad_request(f"optimizer_config.type: {optimizer!r} is not supported (adamw only)")
        lora_rank = int((body.get("lora_config") or {}).get("rank", 0))
        if lora_rank < 0:
            raise bad_request(f"lora_config.rank: must be >= 0 (got {lora_rank})")
        tenant = self.admit(body, body["base_model"], lora_rank)
        model_id = tenant.spec.model_id
        return self.start(tenant, lambda: {"model_id": model_id, "type": "create_model"})

    def admit(self, body: dict[str, Any], base_model: str, lora_rank: int) -> Tenant:
        """A tenant for (session_id, model_seq_id), counted against --max-models (not started)."""
        session = self.sessions.owned(body["session_id"])
        if not (Path(base_model) / "config.json").is_file():
            raise bad_request(
                f"base_model: {base_model!r} is not a local Hugging Face model directory (no config.json); "
                "this gateway trains local models only"
            )
        # The id the SDK derives itself when it creates a client from a checkpoint.
        model_id = f"{session.session_id}:train:{body['model_seq_id']}"
        model_dir = Path(base_model).resolve()
        shared_key = (str(model_dir), lora_rank) if lora_rank and self.config.share_lora_base else None
        own_bytes = (
            adapter_bytes(model_dir, lora_rank)
            if shared_key
            else trainer_bytes(model_dir, lora_rank, self.config.dtype)
        )
        spec = TenantSpec(model_id, session.session_id, str(model_dir), lora_rank, own_bytes,
                          session.owner, dict(body.get("user_metadata") or {}),
                          max_context_length(model_dir))  # fmt: skip
        with self._lock:
            if model_id in self.tenants:
                raise GatewayError(
                    409, f"model_seq_id: {body['model_seq_id']} was already created in this session"
                )
            if len(self.tenants) >= self.config.max_models:
                raise GatewayError(
                    429, f"the gateway serves its maximum of {self.config.max_models} models; "
                    "release one (end its session) or start the gateway with a larger --max-models",
                    "server",
                )  # fmt: skip
            shared = self.shared_trainers.get(shared_key) if shared_key else None
            base_bytes = (  # a new shared trainer's base model, counted once for its models
                trainer_bytes(model_dir, lora_rank, self.config.dtype) if shared_key and shared is None else 0
            )
            self._check_memory(spec.memory_bytes + base_bytes)
            if shared_key is None:
                trainer = Trainer(spec, model_id, self.workdir / model_id / "services", self.config)
            else:
                trainer = shared or self._shared_trainer(shared_key, spec, base_bytes)
            tenant = Tenant(spec, self.workdir / model_id, trainer, adapter=model_id if shared_key else "")
            self.tenants[model_id] = tenant
            session.model_ids.add(model_id)
        return tenant

    def _check_memory(self, needed: int) -> None:
        """Refuse (429) a model whose `needed` bytes would not fit the memory budget beside the
        models already admitted (under self._lock)."""
        in_use = sum(t.spec.memory_bytes for t in self.tenants.values()) + sum(
            t.base_bytes for t in self.shared_trainers.values()
        )
        if in_use + needed > self.memory_budget:
            raise GatewayError(
                429, f"base_model: training it needs about {needed // MIB} MiB (estimated) and "
                f"{in_use // MIB} of the gateway's {self.memory_budget // MIB} MiB are taken by "
                f"{len(self.tenants)} models; release one or raise --memory-budget-gb",
                "server",
            )  # fmt: skip

    def _shared_trainer(self, key: tuple[str, int], spec: TenantSpec, base_bytes: int) -> Trainer:
        """A trainer for the LoRA models of one base and rank (under self._lock; started by its
        first model)."""
        name = f"lora-{Path(key[0]).name}-r{key[1]}-{uuid.uuid4().hex[:6]}"
        trainer = Trainer(spec, name, self.workdir / "shared" / name / "services", self.config, base_bytes)
        self.shared_trainers[key] = trainer
        return trainer

    def start(self, tenant: Tenant, then: Callable[[], dict]) -> str:
        """Start the tenant's trainer on its thread, then run `then` (its future's result); a
        tenant that fails to start is forgotten."""
        model_id = tenant.spec.model_id

        def start() -> dict:
            try:
                tenant.start()
                return then()
            except Exception:
                with self._lock:
                    self.tenants.pop(model_id, None)
                    if set(tenant.trainer.tenants) <= {tenant.adapter}:
                        self.shared_trainers = {
                            k: t for k, t in self.shared_trainers.items() if t is not tenant.trainer
                        }
                tenant.stop()
                raise

        return self.futures.submit(tenant.executor, model_id, start)

    # --- calls -----------------------------------------------------------------------------
    def submit(self, model_id: str, fn: Callable[[Tenant], Any]) -> str:
        """Queue `fn(tenant)` on the caller's model's thread; the request id of its future (the
        trainer's refusals of the request fail it as user errors)."""
        tenant = self.get(model_id)

        def run():
            try:
                return fn(tenant)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                    raise user_error(exc) from None
                raise

        return self.futures.submit(tenant.executor, model_id, run)

    def get_info(self, model_id: str) -> dict:
        spec = self.get(model_id).spec
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_data": {"arch": "hf", "model_name": spec.base_model, "tokenizer_id": spec.base_model},
            "is_lora": bool(spec.lora_rank),
            "lora_rank": spec.lora_rank or None,
            "model_name": spec.base_model,
        }

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        limit = self.get(call.model_id).spec.max_context_length
        for position, datum in enumerate(call.request.data):
            if limit is not None and len(datum.token_ids) > limit:
                raise bad_request(
                    f"data[{position}].model_input: {len(datum.token_ids)} tokens, over the model's context "
                    f"of {limit} (max_position_embeddings in its config.json)"
                )

        def run(tenant: Tenant) -> bytes:
            call.request.adapter = tenant.adapter
            reply = tenant.call(lambda t: t.ForwardBackward(call.request))
            return encode_forward_backward_output(reply)

        return self.submit(call.model_id, run)

    def optim_step(self, model_id: str, adam: dict[str, Any]) -> str:
        # The trainer checks the ranges (beta in [0, 1), eps > 0, ...) and names a bad one.
        request = trainer_pb2.OptimStepRequest(**adam)

        def run(tenant: Tenant) -> dict:
            request.adapter = tenant.adapter
            reply = tenant.call(lambda t: t.OptimStep(request))
            return {"type": "optim_step", "metrics": dict(reply.metrics)}

        return self.submit(model_id, run)

    def supported_models(self) -> list[dict]:
        """The base models being trained (any local model directory trains), with their context."""
        specs = {t.spec.base_model: t.spec for t in list(self.tenants.values())}
        return [
            {
                "model_name": name,
                "max_context_length": spec.max_context_length,
                "trainable": True,
                "sampleable": True,
            }
            for name, spec in sorted(specs.items())
        ]

    # --- release ---------------------------------------------------------------------------
    def unload_model(self, model_id: str) -> str:
        tenant = self.get(model_id)
        session = self.sessions.get(tenant.spec.session_id)
        if session is not None:
            session.model_ids.discard(model_id)
        self.release({model_id})
        return self.futures.done(model_id, {"model_id": model_id, "type": "unload_model"})

    def release(self, model_ids: set[str]) -> None:
        """Stop these models (queued calls are dropped) and forget their futures; a shared trainer
        whose every model leaves stops with them."""
        with self._lock:
            tenants = [self.tenants.pop(m) for m in model_ids if m in self.tenants]
            leaving = {t.spec.model_id for t in tenants}
            for key, trainer in list(self.shared_trainers.items()):
                if {t.spec.model_id for t in trainer.tenants.values()} <= leaving:
                    del self.shared_trainers[key]  # no new model joins a trainer about to stop
        for tenant in tenants:
            tenant.stop()
            self.futures.forget_owner(tenant.spec.model_id)

    def close(self) -> None:
        """Stop every model."""
        with self._lock:
            tenants = list(self.tenants.values())
            self.tenants.clear()
            self.shared_trainers.clear()
        for tenant in tenants:
            tenant.stop()
