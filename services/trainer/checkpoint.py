"""Distributed checkpoints (torch.distributed.checkpoint) in Miles' layout, written atomically.

    <path>/latest_checkpointed_iteration.txt      "12" (replaced atomically after a save)
    <path>/iter_0000012/model/                    DCP: sharded model (loads on any number of ranks)
                        optimizer/                DCP: AdamW state
                        rng/rank_00000.pt         torch (and CUDA) RNG of each rank
                        meta.json                 global_step, extra_state, step results, settings
                        hf/                       optional Hugging Face export (export.py)
                        manifest.json             size and sha256 of every file above

Every rank writes its shards into `<path>/.tmp-iter_0000012-<id>/`; rank 0 then adds meta.json
and the manifest, fsyncs and renames the directory into place (`finalize`).

An async save (torchtitan's approach) splits the write in two: `stage` copies this rank's model
and optimizer state into memory while the ranks wait (the step's critical path), then
`write_staged` writes the copy from a background thread over a process group of its own (the
training collectives go on on the default group meanwhile). `finalize` runs only after every
rank's write returned, so a crash mid-write leaves a `.tmp-` directory that nothing loads.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from rollway.common.manifest import (
    PARTIAL_PREFIX,
    CheckpointError,
    atomic_write_text,
    describe_os_error,
    fsync_tree,
    verify_manifest,
    write_manifest,
)

LATEST = "latest_checkpointed_iteration.txt"
META = "meta.json"
ITER_PATTERN = re.compile(r"^iter_(\d{7,})$")


def iter_dir_name(step: int) -> str:
    return f"iter_{step:07d}"


def temp_dir(root: Path, step: int) -> Path:
    """A fresh temporary directory for a save of `step` under `root` (rank 0 creates it)."""
    return root / f"{PARTIAL_PREFIX}{iter_dir_name(step)}-{uuid.uuid4().hex[:8]}"


def _own_error(exc: CheckpointException) -> BaseException:
    """The error a rank hit inside dcp (an OSError keeps its errno and path)."""
    _, (error, _) = min(exc.failures.items(), key=lambda item: item[0])
    return error if isinstance(error, Exception) else RuntimeError(str(exc))


def _dcp(call, state: dict, directory: Path, process_group: dist.ProcessGroup | None = None) -> None:
    """dcp.save or dcp.load. Their CheckpointException is a BaseException, which nothing above
    catches: a gRPC handler thread died with it and the call hung until the caller's deadline."""
    try:
        call(state, checkpoint_id=str(directory), process_group=process_group)
    except CheckpointException as exc:
        raise _own_error(exc) from None


PROBE_BYTES = 1 << 20


def write_error(exc: Exception, directory: Path) -> str:
    """Path and errno of a save that failed to write into `directory`; re-raises what is not a
    write error. torch's own writers (dcp's, torch.save's) report a full disk as a RuntimeError
    without errno ("unexpected pos"): a probe write next to the partial files gets the OS's answer."""
    if isinstance(exc, OSError):
        return describe_os_error(exc)
    probe = directory / ".write-probe"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as probe_error:
        return f"{describe_os_error(probe_error, directory)} (torch said: {type(exc).__name__}: {str(exc)[:200]})"
    finally:
        probe.unlink(missing_ok=True)
    raise exc


def tied_aliases(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, str]:
    """{second name: first name} of each parameter the model holds under two names that are both
    in `state` (lm_head.weight of a tied embedding). The model state dict lists a tied parameter
    under both, and DCP would write it twice: 0.6 GB more per checkpoint for Qwen3-0.6B."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) not in first:
            first[id(param)] = name
        elif name in state and first[id(param)] in state:
            aliases[name] = first[id(param)]
    return aliases


def model_state_stored(model: torch.nn.Module) -> dict[str, Any]:
    """This rank's model state as a checkpoint stores it: a tied parameter once."""
    state = get_model_state_dict(model)
    aliases = tied_aliases(model, state)
    return {name: value for name, value in state.items() if name not in aliases}


def save_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Every rank: write its model and optimizer shards and its RNG state into `directory`."""
    _dcp(dcp.save, {"model": model_state_stored(model)}, directory / "model")
    _dcp(dcp.save, {"optimizer": get_optimizer_state_dict(model, optimizer)}, directory / "optimizer")
    save_rng(directory)


@dataclass(frozen=True)
class Staged:
    """A copy of this rank's model and optimizer state, made for a write in the background."""

    model: dict[str, Any]
    optimizer: dict[str, Any]


def _copy(value: Any) -> Any:
    """`value` with every tensor cloned (DTensors stay DTensors): training may change the
    originals in place while the copy is written."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copy(item) for item in value)
    return value


def stage(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> Staged:
    """Every rank, while the ranks wait: copy the model and optimizer state and write the RNG
    (small, and it must be the RNG of this moment)."""
    staged = Staged(_copy(model_state_stored(model)), _copy(get_optimizer_state_dict(model, optimizer)))
    save_rng(directory)
    return staged


def write_staged(staged: Staged, directory: Path, process_group: dist.ProcessGroup) -> None:
    """Every rank, in the background: write a staged copy with dcp over `process_group`; returns
    on every rank only after all ranks wrote (dcp gathers every rank's result before its
    metadata is written)."""
    _dcp(dcp.save, {"model": staged.model}, directory / "model", process_group)
    _dcp(dcp.save, {"optimizer": staged.optimizer}, directory / "optimizer", process_group)


def save_rng(directory: Path) -> None:
    """This rank's torch (and CUDA) RNG into `directory`/rng/rank_XXXXX.pt."""
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    (directory / "rng").mkdir(exist_ok=True)
    # Serialised in memory, then written as bytes: torch.save on a full disk raises a RuntimeError
    # without the errno; a plain write raises OSError(ENOSPC) naming the file.
    buffer = io.BytesIO()
    torch.save(rng, buffer)
    (directory / "rng" / f"rank_{dist.get_rank():05d}.pt").write_bytes(buffer.getvalue())


def finalize(tmp: Path, root: Path, step: int, meta: dict[str, Any]) -> Path:
    """Rank 0, after every rank wrote: meta + manifest, fsync, rename into place, move `latest`."""
    atomic_write_text(tmp / META, json.dumps(meta, indent=1, sort_keys=True))
    write_manifest(tmp)
    final = root / iter_dir_name(step)
    replace_dir(tmp, final)
    atomic_write_text(root / LATEST, str(step))
    return final


def replace_dir(tmp: Path, final: Path) -> None:
    """Move the finished `tmp` to `final`, atomically; a `final` already there (a second save
    of the same step) is replaced as a whole."""
    fsync_tree(tmp)
    if final.exists():
        old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def resolve(path: Path) -> Path:
    """A checkpoint directory: `path` itself, or the one `path`'s latest pointer names."""
    if is_checkpoint(path):
        return path
    pointer = path / LATEST
    if pointer.is_file():
        text = pointer.read_text().strip()
        if not text.isdigit():
            raise CheckpointError(f"{pointer}: not a step number ({text[:40]!r})")
        candidate = path / iter_dir_name(int(text))
        if not candidate.is_dir():
            raise CheckpointError(f"{pointer}: names {candidate.name}, which does not exist")
        return candidate
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    steps = _steps(path)
    if not steps:
        raise CheckpointError(f"{path}: holds no checkpoint (no {LATEST}, no iter_* directory)")
    return path / iter_dir_name(steps[-1])


def is_checkpoint(path: Path) -> bool:
    """`path` is one checkpoint (not a directory of them)."""
    return (path / META).is_file() or (path / "manifest.json").is_file()


def _steps(root: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := ITER_PATTERN.match(p.name)))


@dataclass(frozen=True)
class Verified:
    """The checkpoint to load, and the newer ones passed over because they did not verify."""

    directory: Path
    meta: dict[str, Any]
    skipped: list[str]  # why each newer one was passed over (naming its file), newest first


def resolve_verified(path: Path) -> Verified:
    """The newest checkpoint under `path` that verifies, or `path` itself when it is one.

    A directory of checkpoints is tried from the one its latest pointer names (or the highest
    iter_*) down to the oldest: a corrupt or incomplete latest falls back to the newest one that
    verifies, and says which it skipped and why. A checkpoint named directly is never replaced by
    another. CheckpointError naming `path` and every reason when none verifies."""
    if is_checkpoint(path) or not path.is_dir():
        directory = resolve(path)
        return Verified(directory, verify(directory), [])
    skipped: list[str] = []
    steps = _steps(path)
    pointer = path / LATEST
    if pointer.is_file():
        text = pointer.read_text().strip()
        if text.isdigit():
            steps = [s for s in steps if s <= int(text)]
            if int(text) not in steps:
                skipped.append(f"{pointer}: names {iter_dir_name(int(text))}, which does not exist")
        else:
            skipped.append(f"{pointer}: not a step number ({text[:40]!r})")
    for step in reversed(steps):
        directory = path / iter_dir_name(step)
        try:
            return Verified(directory, verify(directory), skipped)
        except CheckpointError as exc:  # its message names the file and the problem
            skipped.append(str(exc))
    if not skipped:
        raise CheckpointError(f"{path}: holds no checkpoint (no {LATEST}, no iter_* directory)")
    raise CheckpointError(f"{path}: no checkpoint verifies ({'; '.join(skipped)})")


def verify(directory: Path) -> dict[str, Any]:
    """Rank 0, before any rank reads: check the manifest and return meta.json."""
    verify_manifest(directory)
    try:
        meta = json.loads((directory / META).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{directory / META}: unreadable ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("global_step"), int):
        raise CheckpointError(f"{directory / META}: no integer global_step")
    return meta


def load_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Every rank: read the model and optimizer (resharded to this world size) and the RNG."""
    full = get_model_state_dict(model)
    aliases = tied_aliases(model, full)
    # Checkpoints before #26 hold a tied parameter twice; reading only its first name loads both.
    model_state = {"model": {name: value for name, value in full.items() if name not in aliases}}
    _dcp(dcp.load, model_state, directory / "model")
    loaded = model_state["model"]
    set_model_state_dict(model, loaded | {alias: loaded[name] for alias, name in aliases.items()})
    optim_state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    _dcp(dcp.load, optim_state, directory / "optimizer")
    set_optimizer_state_dict(model, optimizer, optim_state["optimizer"])
    rng_file = directory / "rng" / f"rank_{dist.get_rank():05d}.pt"
    if not rng_file.is_file():  # loading on more ranks than saved: reuse rank 0's stream
        rng_file = directory / "rng" / "rank_00000.pt"
    rng = torch.load(rng_file, weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
