"""The API's checkpoint calls: save_state and save_weights_for_sampler (saved on the model's
thread, recorded in the CheckpointStore as tinker://<model_id>/<kind>/<name>), load_state into a
live model or a new one, weights_info, and a checkpoint's removal (delete, or its TTL run out).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from rollway.gateway.checkpoints import CheckpointStore, expiry
from rollway.gateway.errors import bad_request, conflict
from rollway.gateway.models import ModelTable
from rollway.gateway.sampling_sessions import SamplingSessionTable, new_sampling_session_id
from rollway.gateway.sessions import SessionTable
from rollway.gateway.tenants import Tenant
from rollway.trainer.v1 import trainer_pb2

SAVE_RESPONSE_TYPE = {"weights": "save_weights", "sampler_weights": "save_weights_for_sampler"}


def checkpoint_name(path: str | None, field: str) -> str:
    """The name a save call gives (a fresh one when it gives none), checked to be one path segment."""
    name = path or uuid.uuid4().hex[:8]
    if not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise bad_request(f"{field}: {name!r} is not a checkpoint name (letters, digits, '-', '_', '.')")
    return name


def check_ttl(ttl_seconds: int | None) -> None:
    if ttl_seconds is not None and ttl_seconds < 1:
        raise bad_request(f"ttl_seconds: must be >= 1 or None (never expires) (got {ttl_seconds})")


class CheckpointCalls:
    """Saves and loads of the models in `models`, recorded in `saved`."""

    def __init__(
        self,
        models: ModelTable,
        sampling: SamplingSessionTable,
        sessions: SessionTable,
        saved: CheckpointStore,
    ):
        self.models = models
        self.sampling = sampling
        self.sessions = sessions
        self.saved = saved
        self.workdir = models.workdir

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
        check_ttl(ttl_seconds)
        overwrite = body.get("overwrite", kind == "sampler_weights")
        tinker_path = f"tinker://{model_id}/{kind}/{name}"

        def run(tenant: Tenant) -> dict:
            if self.saved.get(tinker_path) is not None:
                if not overwrite:
                    raise conflict(
                        f"path: {tinker_path} exists (409 Conflict); save_state(..., overwrite=True) replaces it"
                    )
                self.remove(tinker_path)
            saved = tenant.save(tenant.checkpoint_root / kind / name, tinker_path, kind)
            saved.expires_at = expiry(ttl_seconds)
            saved.user_metadata = dict(body.get("user_metadata") or {})
            self.saved.add(saved, tenant.spec)
            tenant.last_state = saved
            return {"path": tinker_path, "type": SAVE_RESPONSE_TYPE[kind]}

        return self.models.submit(model_id, run)

    def _save_for_new_sampler(self, model_id: str) -> str:
        """save_weights_and_get_sampling_client: an export no path names (not listed, removed with
        its sampler) and a sampling session on it, in the model's session."""
        tenant = self.models.get(model_id)
        session = self.sessions.owned(tenant.spec.session_id)
        sampling_session_id = new_sampling_session_id(session.session_id)

        def run(tenant: Tenant) -> dict:
            # The weights only (no optimizer state: nothing resumes from it), as the RL loop's
            # per-step call wants it: smaller and faster than a checkpoint.
            root = self.workdir / "sampler-exports" / sampling_session_id
            export = trainer_pb2.ExportHFRequest(path=str(root), adapter=tenant.adapter)
            hf_dir = Path(tenant.call(lambda t: t.ExportHF(export)).hf_dir)
            sampler = self.sampling.open(session, sampling_session_id, hf_dir, tenant.spec.base_model, None)
            sampler.exported = root  # removed when the sampler is released
            return {"sampling_session_id": sampling_session_id, "type": "save_weights_for_sampler"}

        return self.models.submit(model_id, run)

    def weights_info(self, tinker_path: str) -> dict:
        _, spec = self.saved.find(tinker_path)
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
        saved, spec = self.saved.find(tinker_path)
        load = trainer_pb2.LoadCheckpointRequest(path=str(saved.directory))

        def load_into(tenant: Tenant) -> dict:
            load.adapter = tenant.adapter
            tenant.call(lambda t: t.LoadCheckpoint(load))
            tenant.last_state = saved
            return {"type": "load_weights", "path": tinker_path, "model_id": tenant.spec.model_id}

        if body.get("model_id"):
            return self.models.submit(body["model_id"], load_into)
        for name in ("session_id", "model_seq_id"):
            if body.get(name) is None:
                raise bad_request(f"{name}: required to create a model from a checkpoint (or give model_id)")
        tenant = self.models.admit(body, body.get("base_model") or spec.base_model, spec.lora_rank)
        return self.models.start(tenant, lambda: load_into(tenant))

    def _owned_checkpoint(self, model_id: str, checkpoint_id: str) -> str:
        tinker_path = f"tinker://{model_id}/{checkpoint_id}"
        self.saved.find(tinker_path)  # bad_request for a malformed id, not_found for an unknown one
        return tinker_path

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None:
        self.remove(self._owned_checkpoint(model_id, checkpoint_id))

    def set_checkpoint_ttl(self, model_id: str, checkpoint_id: str, ttl_seconds: int | None) -> None:
        check_ttl(ttl_seconds)
        self.saved.set_expiry(self._owned_checkpoint(model_id, checkpoint_id), expiry(ttl_seconds))

    def remove(self, tinker_path: str) -> None:
        """Remove a checkpoint; a live model that would restart from it restarts from its previous
        save (or the base model) instead."""
        removed = self.saved.delete(tinker_path)
        if removed is None:
            return
        model_id = tinker_path.removeprefix("tinker://").split("/", 1)[0]
        tenant = self.models.find(model_id)
        if (
            tenant is not None
            and tenant.last_state is not None
            and tenant.last_state.tinker_path == tinker_path
        ):
            remaining = self.saved.of_model(model_id)
            tenant.last_state = remaining[-1] if remaining else None
