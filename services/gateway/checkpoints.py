"""Every checkpoint saved through the API, with its model's spec, recorded in the workdir
(`checkpoints.json`) so that a restarted gateway on the same workdir still loads, samples and
lists them; removed by delete_checkpoint or when its TTL runs out.

A record outlives its model: a released model's checkpoints stay loadable (a new session resumes
from one) until deleted or expired.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rollway.gateway.callers import owns
from rollway.gateway.errors import bad_request, not_found

KINDS = {"weights": "training", "sampler_weights": "sampler"}  # path segment -> SDK checkpoint_type


@dataclass
class TenantSpec:
    """What a client asked for in create_model."""

    model_id: str
    session_id: str
    base_model: str
    lora_rank: int  # 0: full fine-tuning
    memory_bytes: int  # the trainer's estimated memory (memory.py)
    owner: str  # the tenant (API key) whose session created it
    user_metadata: dict[str, str] = field(default_factory=dict)
    max_context_length: int | None = None  # the model config's positions (None: it names none)


@dataclass
class SavedCheckpoint:
    """A checkpoint saved through the API (`weights` for save_state, `sampler_weights` for sampling)."""

    tinker_path: str
    kind: str
    directory: Path  # the trainer's checkpoint (model and optimizer)
    hf_dir: Path  # the same weights as a Hugging Face model directory
    time: datetime
    size_bytes: int
    root: Path  # everything this checkpoint wrote (removed with it)
    expires_at: datetime | None = None
    user_metadata: dict[str, str] = field(default_factory=dict)

    @property
    def checkpoint_id(self) -> str:
        """`<kind>/<name>`, as the SDK's ParsedCheckpointTinkerPath names it."""
        return self.tinker_path.removeprefix("tinker://").split("/", 1)[1]

    def json(self) -> dict:
        """The SDK's Checkpoint."""
        return {
            "checkpoint_id": self.checkpoint_id,
            "checkpoint_type": KINDS[self.kind],
            "time": self.time.isoformat(),
            "tinker_path": self.tinker_path,
            "size_bytes": self.size_bytes,
            "user_metadata": self.user_metadata or None,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
        }


def expiry(ttl_seconds: int | None) -> datetime | None:
    return None if ttl_seconds is None else datetime.now(UTC) + timedelta(seconds=ttl_seconds)


def _record(saved: SavedCheckpoint, spec: TenantSpec) -> dict:
    times = {
        "time": saved.time.isoformat(),
        "expires_at": saved.expires_at.isoformat() if saved.expires_at else None,
    }
    paths = {k: str(getattr(saved, k)) for k in ("directory", "hf_dir", "root")}
    return {"checkpoint": {**asdict(saved), **times, **paths}, "spec": asdict(spec)}


def _from_record(record: dict) -> tuple[SavedCheckpoint, TenantSpec]:
    c = dict(record["checkpoint"])
    for name in ("directory", "hf_dir", "root"):
        c[name] = Path(c[name])
    c["time"] = datetime.fromisoformat(c["time"])
    c["expires_at"] = datetime.fromisoformat(c["expires_at"]) if c["expires_at"] else None
    return SavedCheckpoint(**c), TenantSpec(**record["spec"])


class CheckpointStore:
    """tinker path -> (checkpoint, its model's spec), written through to `<workdir>/checkpoints.json`."""

    def __init__(self, workdir: Path):
        self.file = workdir / "checkpoints.json"
        self._lock = threading.Lock()
        self._saved: dict[str, tuple[SavedCheckpoint, TenantSpec]] = {}
        if self.file.is_file():
            for record in json.loads(self.file.read_text()):
                saved, spec = _from_record(record)
                if saved.directory.exists():  # one removed by hand is forgotten
                    self._saved[saved.tinker_path] = (saved, spec)

    def _write(self) -> None:
        # Written whole and renamed: a gateway killed mid-write keeps the previous record.
        records = [_record(saved, spec) for saved, spec in self._saved.values()]
        self.file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.file.with_suffix(".json.partial")
        partial.write_text(json.dumps(records, indent=1))
        os.replace(partial, self.file)

    def add(self, saved: SavedCheckpoint, spec: TenantSpec) -> None:
        with self._lock:
            self._saved[saved.tinker_path] = (saved, spec)
            self._write()

    def get(self, tinker_path: str) -> tuple[SavedCheckpoint, TenantSpec] | None:
        with self._lock:
            return self._saved.get(tinker_path)

    def find(self, tinker_path: str) -> tuple[SavedCheckpoint, TenantSpec]:
        """The caller's checkpoint a tinker:// path names and its model's spec (the model may be
        released: its checkpoints stay on disk)."""
        parts = tinker_path.removeprefix("tinker://").split("/")
        if (
            not tinker_path.startswith("tinker://")
            or len(parts) != 3
            or parts[1] not in ("weights", "sampler_weights")
        ):
            raise bad_request(
                f"path: {tinker_path!r} is not tinker://<model_id>/(weights|sampler_weights)/<name>"
            )
        saved, spec = self.get(tinker_path) or (None, None)
        if saved is None or not owns(spec.owner):
            raise not_found(f"path: {tinker_path} names no checkpoint of this gateway")
        return saved, spec

    def of_model(self, model_id: str) -> list[SavedCheckpoint]:
        """A model's checkpoints, oldest first."""
        with self._lock:
            return [s for s, spec in self._saved.values() if spec.model_id == model_id]

    def all(self) -> list[tuple[SavedCheckpoint, TenantSpec]]:
        with self._lock:
            return list(self._saved.values())

    def set_expiry(self, tinker_path: str, expires_at: datetime | None) -> None:
        with self._lock:
            self._saved[tinker_path][0].expires_at = expires_at
            self._write()

    def delete(self, tinker_path: str) -> SavedCheckpoint | None:
        """Forget the checkpoint and remove its files; the removed record (None: unknown)."""
        with self._lock:  # files and record go together: a listed checkpoint has its files
            saved, _ = self._saved.pop(tinker_path, (None, None))
            if saved is not None:
                self._write()
                shutil.rmtree(saved.root, ignore_errors=True)
        return saved

    def expired(self) -> list[str]:
        now = datetime.now(UTC)
        with self._lock:
            return [
                p for p, (s, _) in self._saved.items() if s.expires_at is not None and s.expires_at <= now
            ]
