"""The gateway's operations, one method per API call, apart from HTTP (app.py).

Training calls return a request id at once; their work runs on the model's own thread in arrival
order (tenants.py) and retrieve_future reads the result (futures.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from rollway.common.log import get_logger
from rollway.coordinator.plan.host import available_memory
from rollway.gateway.base_rollouts import BaseRollout
from rollway.gateway.callers import caller, owns
from rollway.gateway.checkpoints import CheckpointStore, SavedCheckpoint, TenantSpec, expiry
from rollway.gateway.config import GatewayConfig
from rollway.gateway.errors import GatewayError, bad_request, conflict, not_found
from rollway.gateway.futures import FutureStore
from rollway.gateway.memory import adapter_bytes, max_context_length, trainer_bytes
from rollway.gateway.sampling import Sampler
from rollway.gateway.sessions import SessionTable
from rollway.gateway.tenants import Tenant, Trainer
from rollway.gateway.wire import ForwardBackwardCall, encode_forward_backward_output
from rollway.trainer.v1 import trainer_pb2

log = get_logger("rollway.gateway")
SAVE_RESPONSE_TYPE = {"weights": "save_weights", "sampler_weights": "save_weights_for_sampler"}


def user_error(exc: grpc.RpcError) -> GatewayError:
    """A trainer's refusal (INVALID_ARGUMENT names the field) as the SDK's user error."""
    return GatewayError(400, exc.details() or str(exc.code()))


def checkpoint_name(path: str | None, field: str) -> str:
    name = path or uuid.uuid4().hex[:8]
    if not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise bad_request(f"{field}: {name!r} is not a checkpoint name (letters, digits, '-', '_', '.')")
    return name


class Gateway:
    """Sessions, tenants (models), sampling sessions and futures of one gateway process."""

    def __init__(self, config: GatewayConfig):
        self.config = config
        self.workdir = Path(config.workdir).resolve()
        self.sessions = SessionTable(config.session_timeout_s)
        # What `rollway run` reads too (MemAvailable: free pages leave out the reclaimable cache).
        self.memory_budget = int(config.memory_budget_gb * 2**30) or available_memory()
        self.futures = FutureStore()
        self.tenants: dict[str, Tenant] = {}
        # The trainers LoRA models share, by (base model directory, LoRA rank).
        self.shared_trainers: dict[tuple[str, int], Trainer] = {}
        self.samplers: dict[str, Sampler] = {}
        # One rollout service per base model, shared by its samplers (base_rollouts.py).
        self.rollouts: dict[Path, BaseRollout] = {}
        # Every checkpoint saved through the API (kept across gateway restarts on this workdir).
        self.saved = CheckpointStore(self.workdir)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_loop, name="gateway-watch", daemon=True)
        self._watch.start()

    # --- sessions --------------------------------------------------------------------------
    def create_session(self, user_metadata: dict[str, str] | None = None) -> str:
        return self.sessions.create(caller(), user_metadata).session_id

    def session(self, session_id: str):
        """An open session of the caller's (not_found otherwise)."""
        session = self.sessions.get(session_id)
        if session is None or not owns(session.owner):
            raise not_found(f"session_id: {session_id!r} is not an open session (it ended or timed out)")
        return session

    def heartbeat(self, session_id: str) -> None:
        self.session(session_id)
        if not self.sessions.heartbeat(session_id):
            raise not_found(f"session_id: {session_id!r} is not an open session (it ended or timed out)")

    def end_session(self, session_id: str) -> None:
        self.session(session_id)
        session = self.sessions.end(session_id)
        if session is not None:
            self._release(session.model_ids, session.sampling_session_ids)

    def _watch_loop(self) -> None:
        """Release silent sessions' models; restart dead trainers from their last saved state;
        remove checkpoints whose TTL ran out."""
        while not self._stop.wait(0.5):
            for tinker_path in self.saved.expired():
                log.info("checkpoint expired; removing it", tinker_path=tinker_path)
                self._delete_checkpoint(tinker_path)
            for session in self.sessions.expire():
                log.info("session timed out; releasing its models", session_id=session.session_id,
                            models=sorted(session.model_ids))  # fmt: skip
                self._release(session.model_ids, session.sampling_session_ids)
            for rollout in list(self.rollouts.values()):
                with contextlib.suppress(RuntimeError):  # closed meanwhile
                    rollout.stop_when_idle(self.config.sampler_idle_s)
            for tenant in list(self.tenants.values()):
                try:
                    if tenant.heal():
                        log.warning("trainer restarted", model_id=tenant.spec.model_id)
                except Exception:  # noqa: BLE001 - logged; the next pass tries again
                    log.exception("trainer restart failed", model_id=tenant.spec.model_id)

    def _release(self, model_ids: set[str], sampling_session_ids: set[str]) -> None:
        with self._lock:
            tenants = [self.tenants.pop(m) for m in model_ids if m in self.tenants]
            samplers = [self.samplers.pop(s) for s in sampling_session_ids if s in self.samplers]
            leaving = {t.spec.model_id for t in tenants}
            for key, trainer in list(self.shared_trainers.items()):
                if {t.spec.model_id for t in trainer.tenants.values()} <= leaving:
                    del self.shared_trainers[key]  # no new model joins a trainer about to stop
            for sampler in samplers:
                sampler.rollout.num_samplers -= 1
            unused = [b for b, r in self.rollouts.items() if r.num_samplers == 0]
            rollouts = [self.rollouts.pop(b) for b in unused]
        for tenant in tenants:
            tenant.stop()
            self.futures.forget_owner(tenant.spec.model_id)
        for sampler in samplers:
            sampler.stop()
        for rollout in rollouts:  # after its samplers' clean-up, which runs on its thread
            rollout.executor.submit(rollout.close)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            tenants, samplers = list(self.tenants.values()), list(self.samplers.values())
            rollouts = list(self.rollouts.values())
            self.tenants.clear()
            self.samplers.clear()
            self.shared_trainers.clear()
            self.rollouts.clear()
        for rollout in rollouts:  # first: its samplers then clean up at once, not on its thread
            rollout.close()
        for item in [*tenants, *samplers]:
            item.stop()

    # --- models ----------------------------------------------------------------------------
    def tenant(self, model_id: str) -> Tenant:
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

    def create_model(self, body: dict[str, Any]) -> str:
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise bad_request(f"optimizer_config.type: {optimizer!r} is not supported (adamw only)")
        lora_rank = int((body.get("lora_config") or {}).get("rank", 0))
        if lora_rank < 0:
            raise bad_request(f"lora_config.rank: must be >= 0 (got {lora_rank})")
        tenant = self._new_tenant(body, body["base_model"], lora_rank)
        model_id = tenant.spec.model_id
        return self._start_tenant(tenant, lambda: {"model_id": model_id, "type": "create_model"})

    def _new_tenant(self, body: dict[str, Any], base_model: str, lora_rank: int) -> Tenant:
        """A tenant for (session_id, model_seq_id), counted against --max-models (not started)."""
        session = self.session(body["session_id"])
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
            needed = spec.memory_bytes + (
                trainer_bytes(model_dir, lora_rank, self.config.dtype) if shared_key and shared is None else 0
            )
            in_use = sum(t.spec.memory_bytes for t in self.tenants.values()) + sum(
                t.base_bytes for t in self.shared_trainers.values()
            )
            if in_use + needed > self.memory_budget:
                mib = 2**20
                raise GatewayError(
                    429, f"base_model: training it needs about {needed // mib} MiB (estimated) and "
                    f"{in_use // mib} of the gateway's {self.memory_budget // mib} MiB are taken by "
                    f"{len(self.tenants)} models; release one or raise --memory-budget-gb",
                    "server",
                )  # fmt: skip
            if shared_key is None:
                trainer = Trainer(spec, model_id, self.workdir / model_id / "services", self.config)
            else:
                trainer = shared or self._shared_trainer(shared_key, spec, needed - spec.memory_bytes)
            tenant = Tenant(spec, self.workdir / model_id, trainer, adapter=model_id if shared_key else "")
            self.tenants[model_id] = tenant
            session.model_ids.add(model_id)
        return tenant

    def _shared_trainer(self, key: tuple[str, int], spec: TenantSpec, base_bytes: int) -> Trainer:
        """A trainer for the LoRA models of one base and rank (under self._lock; started by its
        first model)."""
        name = f"lora-{Path(key[0]).name}-r{key[1]}-{uuid.uuid4().hex[:6]}"
        trainer = Trainer(spec, name, self.workdir / "shared" / name / "services", self.config, base_bytes)
        self.shared_trainers[key] = trainer
        return trainer

    def _start_tenant(self, tenant: Tenant, then) -> str:
        """Start the tenant's trainer on its thread, then run `then` (its future's result)."""
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

    def get_info(self, model_id: str) -> dict:
        spec = self.tenant(model_id).spec
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_data": {"arch": "hf", "model_name": spec.base_model, "tokenizer_id": spec.base_model},
            "is_lora": bool(spec.lora_rank),
            "lora_rank": spec.lora_rank or None,
            "model_name": spec.base_model,
        }

    def unload_model(self, model_id: str) -> str:
        tenant = self.tenant(model_id)
        session = self.sessions.get(tenant.spec.session_id)
        if session is not None:
            session.model_ids.discard(model_id)
        self._release({model_id}, set())
        return self.futures.done(model_id, {"model_id": model_id, "type": "unload_model"})

    # --- training --------------------------------------------------------------------------
    def _submit(self, model_id: str, fn) -> str:
        tenant = self.tenant(model_id)

        def run():
            try:
                return fn(tenant)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                    raise user_error(exc) from None
                raise

        return self.futures.submit(tenant.executor, model_id, run)

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        limit = self.tenant(call.model_id).spec.max_context_length
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

        return self._submit(call.model_id, run)

    def optim_step(self, model_id: str, adam: dict[str, Any]) -> str:
        # The trainer checks the ranges (beta in [0, 1), eps > 0, ...) and names a bad one.
        request = trainer_pb2.OptimStepRequest(**adam)

        def run(tenant: Tenant) -> dict:
            request.adapter = tenant.adapter
            reply = tenant.call(lambda t: t.OptimStep(request))
            return {"type": "optim_step", "metrics": dict(reply.metrics)}

        return self._submit(model_id, run)

    def save_weights(self, body: dict[str, Any], kind: str) -> str:
        """save_state (kind `weights`) or save_weights_for_sampler (`sampler_weights`): the
        checkpoint tinker://<model_id>/<kind>/<name>. An existing name is refused unless
        `overwrite` (save_state's default is False; save_weights_for_sampler sends none and
        replaces, as the hosted service does); `ttl_seconds` makes it expire."""
        model_id = body["model_id"]
        if kind == "sampler_weights" and body.get("path") is None:
            return self._save_for_new_sampler(model_id)
        name = checkpoint_name(body.get("path"), "path")
        ttl_seconds = body.get("ttl_seconds")
        if ttl_seconds is not None and ttl_seconds < 1:
            raise bad_request(f"ttl_seconds: must be >= 1 or None (never expires) (got {ttl_seconds})")
        overwrite = body.get("overwrite", kind == "sampler_weights")
        tinker_path = f"tinker://{model_id}/{kind}/{name}"

        def run(tenant: Tenant) -> dict:
            if self.saved.get(tinker_path) is not None:
                if not overwrite:
                    raise conflict(
                        f"path: {tinker_path} exists (409 Conflict); save_state(..., overwrite=True) replaces it"
                    )
                self._delete_checkpoint(tinker_path)
            saved = tenant.save(tenant.checkpoint_root / kind / name, tinker_path, kind)
            saved.expires_at = expiry(ttl_seconds)
            saved.user_metadata = dict(body.get("user_metadata") or {})
            self.saved.add(saved, tenant.spec)
            tenant.last_state = saved
            return {"path": tinker_path, "type": SAVE_RESPONSE_TYPE[kind]}

        return self._submit(model_id, run)

    def _save_for_new_sampler(self, model_id: str) -> str:
        """save_weights_and_get_sampling_client: an export no path names (not listed, removed with
        its sampler) and a sampling session on it, in the model's session."""
        tenant = self.tenant(model_id)
        session = self.session(tenant.spec.session_id)
        sampling_session_id = f"{session.session_id}-sampler-{uuid.uuid4().hex[:8]}"

        def run(tenant: Tenant) -> dict:
            # The weights only (no optimizer state: nothing resumes from it), as the RL loop's
            # per-step call wants it: smaller and faster than a checkpoint.
            root = self.workdir / "sampler-exports" / sampling_session_id
            export = trainer_pb2.ExportHFRequest(path=str(root), adapter=tenant.adapter)
            hf_dir = Path(tenant.call(lambda t: t.ExportHF(export)).hf_dir)
            sampler = self._open_sampler(session, sampling_session_id, hf_dir, tenant.spec.base_model, None)
            sampler.exported = root  # removed when the sampler is released
            return {"sampling_session_id": sampling_session_id, "type": "save_weights_for_sampler"}

        return self._submit(model_id, run)

    def find_checkpoint(self, tinker_path: str) -> tuple[TenantSpec, SavedCheckpoint]:
        """The checkpoint a tinker:// path names and its model's spec (the model may be released:
        its checkpoints stay on disk)."""
        parts = tinker_path.removeprefix("tinker://").split("/")
        if (
            not tinker_path.startswith("tinker://")
            or len(parts) != 3
            or parts[1] not in ("weights", "sampler_weights")
        ):
            raise bad_request(
                f"path: {tinker_path!r} is not tinker://<model_id>/(weights|sampler_weights)/<name>"
            )
        saved, spec = self.saved.get(tinker_path) or (None, None)
        if saved is None or not owns(spec.owner):
            raise not_found(f"path: {tinker_path} names no checkpoint of this gateway")
        return spec, saved

    def weights_info(self, tinker_path: str) -> dict:
        spec, _ = self.find_checkpoint(tinker_path)
        return {
            "base_model": spec.base_model,
            "is_lora": bool(spec.lora_rank),
            "lora_rank": spec.lora_rank or None,
        }

    def load_weights(self, body: dict[str, Any]) -> str:
        """Into a live model (load_state), or into a new one (create_training_client_from_state:
        no model_id; the checkpoint's base model and LoRA rank). The optimizer state is restored
        with the weights either way (the trainer's checkpoints hold both)."""
        tinker_path = body["path"]
        spec, saved = self.find_checkpoint(tinker_path)
        load = trainer_pb2.LoadCheckpointRequest(path=str(saved.directory))
        if body.get("model_id"):
            model_id = body["model_id"]

            def run(tenant: Tenant) -> dict:
                load.adapter = tenant.adapter
                tenant.call(lambda t: t.LoadCheckpoint(load))
                tenant.last_state = saved
                return {"type": "load_weights", "path": tinker_path, "model_id": model_id}

            return self._submit(model_id, run)
        for name in ("session_id", "model_seq_id"):
            if body.get(name) is None:
                raise bad_request(f"{name}: required to create a model from a checkpoint (or give model_id)")
        tenant = self._new_tenant(body, body.get("base_model") or spec.base_model, spec.lora_rank)

        def loaded() -> dict:
            load.adapter = tenant.adapter
            tenant.call(lambda t: t.LoadCheckpoint(load))
            tenant.last_state = saved
            return {"type": "load_weights", "path": tinker_path, "model_id": tenant.spec.model_id}

        return self._start_tenant(tenant, loaded)

    # --- sampling --------------------------------------------------------------------------
    def create_sampling_session(self, session_id: str, model_path: str | None, base_model: str | None) -> str:
        session = self.session(session_id)
        if model_path:
            spec, saved = self.find_checkpoint(model_path)
            model_dir, base_model = saved.hf_dir, spec.base_model
        elif base_model and (Path(base_model) / "config.json").is_file():
            model_dir = Path(base_model).resolve()
        else:
            raise bad_request(
                "model_path or base_model: name a saved sampler checkpoint or a local model directory"
            )
        sampling_session_id = f"{session_id}-sampler-{uuid.uuid4().hex[:8]}"
        self._open_sampler(session, sampling_session_id, model_dir, base_model, model_path)
        return sampling_session_id

    def _open_sampler(
        self, session, sampling_session_id: str, model_dir: Path, base_model, model_path
    ) -> Sampler:
        base = Path(base_model).resolve()
        with self._lock:
            rollout = self.rollouts.get(base)
            if rollout is None:
                rollout = self.rollouts[base] = BaseRollout(base, self.workdir / "rollouts", self.config)
            rollout.num_samplers += 1
        sampler = Sampler(sampling_session_id, Path(model_dir).resolve(), rollout)
        if sampler.weights != base:  # on the rollout's thread, ahead of the first sample
            rollout.submit(lambda: rollout.prepare(sampler.weights))
        sampler.owner = session.owner
        sampler.describe = {
            "sampler_id": sampling_session_id,
            "base_model": str(base_model),
            "model_path": model_path,
        }
        with self._lock:
            self.samplers[sampling_session_id] = sampler
            session.sampling_session_ids.add(sampling_session_id)
        return sampler

    def sampler_info(self, sampling_session_id: str) -> dict:
        sampler = self.samplers.get(sampling_session_id)
        if sampler is None or not owns(sampler.owner):
            raise not_found(f"sampler_id: {sampling_session_id!r} is not an open sampling session")
        return sampler.describe

    def sample(self, body: dict[str, Any]) -> str:
        sampler = self.samplers.get(body.get("sampling_session_id") or "")
        if sampler is None or not owns(sampler.owner):
            raise not_found(
                f"sampling_session_id: {body.get('sampling_session_id')!r} is not an open sampling session"
            )
        request = sampler.generate_request(body)  # validated now: a bad request is refused at once
        sampler.rollout.last_used = time.monotonic()
        return self.futures.submit(
            sampler.rollout.executor,
            sampler.sampling_session_id,
            lambda: sampler.sample(request, body.get("prompt_logprobs_last_n")),
        )

    # --- listing ---------------------------------------------------------------------------
    def training_runs(self) -> list[dict]:
        with self._lock:
            tenants = list(self.tenants.values())
        return [self.training_run(t.spec.model_id) for t in tenants if owns(t.spec.owner)]

    def training_run(self, model_id: str) -> dict:
        """A live model, or a released one whose checkpoints remain."""
        tenant = self.tenants.get(model_id)
        saved = self.saved.of_model(model_id)
        spec = (
            tenant.spec
            if tenant is not None
            else next((sp for c, sp in self.saved.all() if sp.model_id == model_id), None)
        )
        if spec is None or not owns(spec.owner):
            raise not_found(
                f"model_id: {model_id!r} is not a model of this gateway (released or never created)"
            )
        last = {
            kind: next((c for c in reversed(saved) if c.kind == kind), None)
            for kind in ("weights", "sampler_weights")
        }
        last_request = (
            tenant.last_request_time if tenant is not None else max((c.time for c in saved), default=None)
        )
        return {
            "training_run_id": model_id,
            "base_model": spec.base_model,
            "model_owner": spec.session_id,
            "is_lora": bool(spec.lora_rank),
            "lora_rank": spec.lora_rank or None,
            "last_request_time": (last_request or datetime.now(UTC)).isoformat(),
            "last_checkpoint": last["weights"] and last["weights"].json(),
            "last_sampler_checkpoint": last["sampler_weights"] and last["sampler_weights"].json(),
            "user_metadata": spec.user_metadata or None,
        }

    def checkpoints(self, model_id: str) -> list[dict]:
        self.training_run(model_id)  # not_found for another tenant's or an unknown model
        return [c.json() for c in self.saved.of_model(model_id)]

    def user_checkpoints(self, limit: int, offset: int) -> dict:
        """The caller's checkpoints of every model, newest first, paginated."""
        mine = sorted(
            (c for c, spec in self.saved.all() if owns(spec.owner)), key=lambda c: c.time, reverse=True
        )
        page = mine[offset : offset + limit]
        return {"checkpoints": [c.json() for c in page], "cursor": cursor(offset, limit, len(mine))}

    def _owned_checkpoint(self, model_id: str, checkpoint_id: str) -> str:
        tinker_path = f"tinker://{model_id}/{checkpoint_id}"
        self.find_checkpoint(tinker_path)  # bad_request for a malformed id, not_found for an unknown one
        return tinker_path

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None:
        self._delete_checkpoint(self._owned_checkpoint(model_id, checkpoint_id))

    def _delete_checkpoint(self, tinker_path: str) -> None:
        """Remove a checkpoint; a live model that would restart from it restarts from its previous
        save (or the base model) instead."""
        removed = self.saved.delete(tinker_path)
        if removed is None:
            return
        model_id = tinker_path.removeprefix("tinker://").split("/", 1)[0]
        tenant = self.tenants.get(model_id)
        if (
            tenant is not None
            and tenant.last_state is not None
            and tenant.last_state.tinker_path == tinker_path
        ):
            remaining = self.saved.of_model(model_id)
            tenant.last_state = remaining[-1] if remaining else None

    def set_checkpoint_ttl(self, model_id: str, checkpoint_id: str, ttl_seconds: int | None) -> None:
        if ttl_seconds is not None and ttl_seconds < 1:
            raise bad_request(f"ttl_seconds: must be >= 1 or None (never expires) (got {ttl_seconds})")
        self.saved.set_expiry(self._owned_checkpoint(model_id, checkpoint_id), expiry(ttl_seconds))

    def list_sessions(self, limit: int, offset: int) -> dict:
        mine = [s.session_id for s in self.sessions.all() if owns(s.owner)]
        return {"sessions": mine[offset : offset + limit]}

    def get_session(self, session_id: str) -> dict:
        session = self.session(session_id)
        return {
            "training_run_ids": sorted(session.model_ids),
            "sampler_ids": sorted(session.sampling_session_ids),
            "user_metadata": session.user_metadata or None,
        }

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


def cursor(offset: int, limit: int, total: int) -> dict:
    return {"offset": offset, "limit": limit, "total_count": total}
