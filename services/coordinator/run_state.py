"""The coordinator's resumable state and run checkpoints.

A run checkpoint is a directory SAVE/rollout_{k:07d}/ holding
    trainer/            written by trainer.SaveCheckpoint (model, optimizer, scheduler, RNG)
    dataloader.json     the data cursor from dataloader.GetState
    coordinator.json    this module's RunState, written last and atomically
A checkpoint is complete only once coordinator.json exists; SAVE/latest_checkpointed_iteration.txt
names the newest complete one (Miles' file name). A save killed half-way is never picked up.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

LATEST_FILE = "latest_checkpointed_iteration.txt"


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
    """Write the dataloader cursor and the coordinator state (last), then point `latest` at it."""
    directory.mkdir(parents=True, exist_ok=True)
    if dataloader_state is not None:
        _write_atomic(directory / "dataloader.json", dataloader_state)
    state.capture_rng()
    _write_atomic(directory / "coordinator.json", json.dumps(asdict(state), indent=1))
    _write_atomic(directory.parent / LATEST_FILE, directory.name + "\n")


def find_checkpoint(path: str | Path) -> Path | None:
    """`path` itself if it is a complete checkpoint, else the latest complete one inside it."""
    path = Path(path)
    if (path / "coordinator.json").exists():
        return path
    latest = path / LATEST_FILE
    if latest.exists():
        candidate = path / latest.read_text().strip()
        if (candidate / "coordinator.json").exists():
            return candidate
    complete = sorted(p for p in path.glob("rollout_*") if (p / "coordinator.json").exists())
    return complete[-1] if complete else None


def read_checkpoint(directory: Path) -> tuple[RunState, str | None]:
    state = RunState(**json.loads((directory / "coordinator.json").read_text()))
    cursor = directory / "dataloader.json"
    return state, cursor.read_text() if cursor.exists() else None
