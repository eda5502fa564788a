"""The coordinator's resumable state and run checkpoints.

A run checkpoint is a directory SAVE/rollout_{k:07d}/ holding
    trainer/            written by trainer.SaveCheckpoint (model, optimizer, scheduler, RNG)
    dataloader.json     the data cursor from dataloader.GetState
    coordinator.json    this module's RunState, written atomically
    manifest.json       size and sha256 of every file above (trainer/: of its own manifest)
A checkpoint is complete only once coordinator.json exists; SAVE/latest_checkpointed_iteration.txt
names the newest complete one (Miles' file name). A save killed half-way is never picked up.

Resume (`resume`) tries the complete checkpoints newest first: one whose files do not read (a
JSON that does not parse or holds the wrong fields), whose trainer checkpoint does not verify, or
whose files differ from its manifest (a flipped bit that still parses: a cursor two prompts
back), whose cursor the dataloader refuses is skipped with a warning naming the file and why, and the
previous one is used. The trainer checkpoint loaded is always the one inside the run checkpoint
used, so the model, optimizer, data cursor and run state come from the same step.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import grpc
import numpy as np

from rollway.common.log import get_logger
from rollway.common.manifest import CheckpointError, describe_os_error, verify_manifest, write_manifest
from rollway.dataloader.v1 import dataloader_pb2
from rollway.trainer.v1 import trainer_pb2

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "coordinator.json"
CURSOR_FILE = "dataloader.json"
MANIFEST_FORMAT = "rollway-run-checkpoint/1"

log = get_logger("rollway.coordinator.run_state")


class RunCheckpointError(RuntimeError):
    """A run checkpoint cannot be resumed from; the message names the file and the problem."""


class CheckpointWriteError(RuntimeError):
    """A run checkpoint could not be written (on_checkpoint_error: fail); names the path and errno."""


def write_failure(exc: BaseException, directory: Path) -> str | None:
    """Why saving `directory` failed, when it is a write failure: the trainer's RESOURCE_EXHAUSTED
    (its message names the path and errno) or the coordinator's own OSError; None for anything
    else. The partial run checkpoint (no coordinator.json) is removed: it cannot be resumed from
    and it holds the disk that just ran out."""
    if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        reason = f"trainer: {exc.details()}"
    elif isinstance(exc, OSError):
        reason = f"coordinator: {describe_os_error(exc)}"
    else:
        return None
    if directory.is_dir() and not (directory / STATE_FILE).exists():
        shutil.rmtree(directory, ignore_errors=True)
    return reason


@dataclass
class RunState:
    """Everything the coordinator needs to continue a run exactly where it stopped."""

    next_rollout_id: int = 0
    next_batch_id: int = 0
    next_group_index: int = 0
    weight_version: int = 0
    tokens_seen: int = 0
    epoch: int = 0
    rng_state: dict = field(default_factory=dict)
    # --partial-rollout: groups with aborted samples, to continue in the next rollout (each
    # sample a base64 serialized common.v1.Sample; see rollout_collect.py).
    partial_groups: list[list[str]] = field(default_factory=list)

    def capture_rng(self) -> None:
        version, internal, gauss = random.getstate()
        self.rng_state = {"python": [version, list(internal), gauss], "numpy": _numpy_state()}

    def restore_rng(self) -> None:
        if self.rng_state:
            version, internal, gauss = self.rng_state["python"]
            random.setstate((version, tuple(internal), gauss))
            name, keys, pos, has_gauss, cached = self.rng_state["numpy"]
            np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def _numpy_state() -> list:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def checkpoint_dir(save: str | Path, rollout_id: int) -> Path:
    return Path(save) / f"rollout_{rollout_id:07d}"


def write_checkpoint(directory: Path, state: RunState, dataloader_state: str | None) -> None:
    """Write the dataloader cursor, the coordinator state and the manifest of every file, then
    point `latest` at it."""
    directory.mkdir(parents=True, exist_ok=True)
    if dataloader_state is not None:
        _write_atomic(directory / CURSOR_FILE, dataloader_state)
    state.capture_rng()
    _write_atomic(directory / STATE_FILE, json.dumps(asdict(state), indent=1))
    write_manifest(directory, MANIFEST_FORMAT)
    _write_atomic(directory.parent / LATEST_FILE, directory.name + "\n")


def find_checkpoint(path: str | Path) -> Path | None:
    """`path` itself if it is a complete checkpoint, else the latest complete one inside it."""
    found = candidates(path)
    return found[0] if found else None


def candidates(path: str | Path) -> list[Path]:
    """Complete run checkpoints to resume from, best first.

    `path` itself when it is one (named directly: nothing else is tried); else the one SAVE's
    latest pointer names, then every older complete one, newest first. A checkpoint newer than
    the pointer is a save that stopped before moving it, and is not used."""
    path = Path(path)
    if (path / STATE_FILE).exists():
        return [path]
    if not path.is_dir():
        return []
    complete = sorted((p for p in path.glob("rollout_*") if (p / STATE_FILE).exists()), reverse=True)
    latest = path / LATEST_FILE
    if latest.exists():
        name = latest.read_text().strip()
        if (path / name / STATE_FILE).exists():
            return [p for p in complete if p.name <= name]
        log.warning(
            "the latest pointer names no complete run checkpoint", pointer=str(latest), names=name[:80]
        )
    return complete


def read_checkpoint(directory: Path) -> tuple[RunState, str | None]:
    """The run state and the data cursor (JSON text, or None) of one run checkpoint.

    RunCheckpointError naming the file when either does not read or parse, or when any file
    differs from the manifest (checked after parsing, so a file that does not parse says so)."""
    state_file = directory / STATE_FILE
    data = _read_json(state_file)
    known = {f.name: f for f in fields(RunState)}
    if not isinstance(data, dict):
        raise RunCheckpointError(f"{state_file}: not a JSON object")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise RunCheckpointError(f"{state_file}: unknown field(s) {', '.join(unknown)}")
    for name, value in data.items():
        kind = {"int": int, "dict": dict}.get(known[name].type, list)  # the annotations, as strings
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise RunCheckpointError(f"{state_file}: {name} must be a{' non-negative' * (kind is int)} "
                                     f"{kind.__name__} (got {json.dumps(value)[:40]})")  # fmt: skip
    cursor_file = directory / CURSOR_FILE
    cursor = None
    if cursor_file.exists():
        cursor = _read_text(cursor_file)
        if not isinstance(_parse_json(cursor_file, cursor), dict):
            raise RunCheckpointError(f"{cursor_file}: not a JSON object")
    try:
        verify_manifest(directory, MANIFEST_FORMAT)
    except CheckpointError as exc:  # names the file
        raise RunCheckpointError(str(exc)) from None
    return RunState(**data), cursor


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RunCheckpointError(f"{path}: unreadable ({exc})") from None


def _parse_json(path: Path, text: str):
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RunCheckpointError(f"{path}: not valid JSON ({exc})") from None


def _read_json(path: Path):
    return _parse_json(path, _read_text(path))


@dataclass
class Resumed:
    """The run checkpoint a run continues from, and the newer ones skipped (why, newest first)."""

    directory: Path
    state: RunState
    cursor: str | None
    skipped: list[str]


def resume(path: str | Path, restore: Callable[[Path, RunState, str | None], None]) -> Resumed | None:
    """Continue from the newest run checkpoint under `path` that reads and restores.

    `restore(directory, state, cursor)` loads the services (restore_services) and raises
    RunCheckpointError when they refuse that checkpoint; the previous one is tried next, so a
    later success overrides what an earlier attempt loaded. None when `path` holds no complete
    checkpoint; RunCheckpointError naming `path` and every reason when none can be used."""
    skipped: list[str] = []
    for directory in candidates(path):
        try:
            state, cursor = read_checkpoint(directory)
            restore(directory, state, cursor)
        except RunCheckpointError as exc:
            log.warning("run checkpoint unusable, trying the previous one", checkpoint=str(directory),
                        reason=str(exc))  # fmt: skip
            skipped.append(str(exc))
            continue
        if skipped:
            log.warning("resumed from an older run checkpoint", checkpoint=str(directory),
                        num_skipped=len(skipped), skipped=skipped)  # fmt: skip
        return Resumed(directory, state, cursor, skipped)
    if skipped:
        raise RunCheckpointError(f"{path}: no usable run checkpoint ({'; '.join(skipped)})")
    return None


def restore_services(
    services, uses_trainer: bool, directory: Path, state: RunState, cursor: str | None
) -> None:
    """Load one run checkpoint into the trainer (its trainer/ directory) and the dataloader (its cursor).

    A refusal of the checkpoint's content raises RunCheckpointError naming the file; anything else
    (a service down) propagates. The trainer checkpoint is checked to belong to this run state."""
    if uses_trainer:
        trainer_dir = directory / "trainer"
        try:
            loaded = services.trainer.LoadCheckpoint(trainer_pb2.LoadCheckpointRequest(path=str(trainer_dir)))
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                raise
            raise RunCheckpointError(f"{trainer_dir}: {exc.details()}") from None
        if loaded.skipped_checkpoints:  # an older trainer checkpoint would not match this run state
            raise RunCheckpointError(f"{trainer_dir}: {loaded.skipped_checkpoints[0]}")
        saved_for = loaded.extra_state.fields.get("next_rollout_id")
        if saved_for is not None and int(saved_for.number_value) != state.next_rollout_id:
            raise RunCheckpointError(
                f"{loaded.checkpoint_dir}: saved for rollout {int(saved_for.number_value)}, but "
                f"{directory / STATE_FILE} continues at rollout {state.next_rollout_id}"
            )
    if cursor is not None and services.dataloader is not None:
        request = dataloader_pb2.RestoreStateRequest(state_json=cursor)
        try:
            services.dataloader.RestoreState(request)
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                raise
            raise RunCheckpointError(
                f"{directory / CURSOR_FILE}: refused by the dataloader: {exc.details()}"
            ) from None
