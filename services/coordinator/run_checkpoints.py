"""A run's checkpoints as its loop (run.py) takes them: the one it resumes from, a save after a
step when due, and the data position each save stores.

    step k ends, save due ──> trainer.SaveCheckpoint ──> coordinator.json, manifest, latest
                              pointer (run_state.py), rotation past save_total_limit
    async_save:               trainer.SaveCheckpoint(async_save) returns once the trainer staged
                              its state; the rest completes in the background
                              (background_checkpoint.py), finished by the next save or the end

Batches are fetched ahead of the step that uses them (SFT prefetch, async generation), so the
data position (dataloader cursor, next batch id, next group index, carried groups) just before
the data of step k was fetched is recorded by k (mark_data_position): a save after step k - 1
stores that of step k, and a resume neither skips nor repeats data.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from pathlib import Path

import grpc

from rollway.common.log import get_logger
from rollway.common.manifest import remove_partial_dirs, tree_bytes
from rollway.common.structs import to_struct
from rollway.coordinator import checkpoint_rotation, run_state
from rollway.coordinator.background_checkpoint import BackgroundCheckpoint
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.remote import Services
from rollway.coordinator.run_state import RunState
from rollway.dataloader.v1 import dataloader_pb2
from rollway.trainer.v1 import trainer_pb2

log = get_logger("rollway.coordinator.run")

# A data position: (dataloader cursor, next batch id, next group index, carried partial groups).
DataPosition = tuple[str | None, int, int, list]


class RunCheckpoints:
    """Resume and saves of one run over its services, under the run's `save` and `load`."""

    def __init__(self, config: CoordinatorConfig, services: Services, uses_trainer: bool):
        self.config = config
        self.services = services
        self.uses_trainer = uses_trainer
        self.directory = ""  # the newest complete run checkpoint this run wrote
        self.background = BackgroundCheckpoint(services.trainer)  # async_save's
        # The data position just before the data of step k was fetched, by k.
        self._data_positions: dict[int, DataPosition] = {}
        self._positions_lock = threading.Lock()  # the generate worker records them too

    def resume(self) -> run_state.Resumed | None:
        """The newest usable run checkpoint under `load` (else `save`), loaded into the services
        (older ones are tried past corrupt ones); None when there is none. Saves that crashed
        half-way under `save` are removed first: nothing saves there yet."""
        if self.config.save:
            removed = remove_partial_dirs(Path(self.config.save))
            if removed:
                log.info("removed partial checkpoint directories", paths=[str(p) for p in removed])
        source = self.config.load or self.config.save
        restore = functools.partial(run_state.restore_services, self.services, self.uses_trainer)
        return run_state.resume(source, restore) if source else None

    def save(self, state: RunState, metrics: dict[str, float], last: bool) -> None:
        """Save the run checkpoint of `state` (after step state.next_rollout_id - 1). On the step's
        path: the whole save, or with async_save the wait for the previous write and the trainer's
        staging (perf/save_time; the write itself: perf/save_write_time); `last` finishes it."""
        save_start = time.perf_counter()
        if self.config.async_save and self.uses_trainer:
            self._save_async(state, metrics, last)
        else:
            saved = self._save_now(state)
            if saved is not None:
                metrics["checkpoint/bytes"] = float(tree_bytes(saved))
        metrics["perf/save_time"] = time.perf_counter() - save_start

    def _save_now(self, state: RunState) -> Path | None:
        """Write a run checkpoint, then delete the ones past save_total_limit; the directory
        written, or None when the write failed and on_checkpoint_error says continue."""
        directory = run_state.checkpoint_dir(self.config.save, state.next_rollout_id)
        try:
            snapshot, cursor = self._snapshot(state)
            if self.uses_trainer:
                request = self._trainer_save_request(directory, state, async_save=False)
                self.services.trainer.SaveCheckpoint(request)
            self._complete(directory, snapshot, cursor)
        except (grpc.RpcError, OSError) as exc:
            return self._failed(exc, directory)
        return directory

    def _failed(self, exc: grpc.RpcError | OSError, directory: Path) -> None:
        """A save that could not write: None when on_checkpoint_error says continue; raises else."""
        reason = run_state.write_failure(exc, directory)
        if reason is None:
            raise exc
        if self.config.on_checkpoint_error == "continue":
            log.warning("checkpoint failed, training on", checkpoint=str(directory), error=reason)
            return None
        raise run_state.CheckpointWriteError(
            f"checkpoint {directory} could not be written ({reason}); on_checkpoint_error: fail"
        ) from None

    def _trainer_save_request(
        self, directory: Path, state: RunState, async_save: bool
    ) -> trainer_pb2.SaveCheckpointRequest:
        # The rollout it was saved for: a resume checks it against coordinator.json.
        extra_state = to_struct({"next_rollout_id": state.next_rollout_id})
        return trainer_pb2.SaveCheckpointRequest(
            path=str(directory / "trainer"), extra_state=extra_state, async_save=async_save
        )

    def _snapshot(self, state: RunState) -> tuple[RunState, str | None]:
        """The run state and data cursor a checkpoint taken now stores."""
        snapshot = dataclasses.replace(state)
        with self._positions_lock:
            position = self._data_positions.get(state.next_rollout_id)
        cursor = self.data_cursor() if position is None else position[0]
        if position is not None:
            _, snapshot.next_batch_id, snapshot.next_group_index, snapshot.partial_groups = position
        return snapshot, cursor

    def _complete(self, directory: Path, snapshot: RunState, cursor: str | None) -> None:
        """coordinator.json, manifest and latest pointer (the checkpoint counts from here), then
        the rotation past save_total_limit."""
        run_state.write_checkpoint(directory, snapshot, cursor)
        self.directory = str(directory)
        log.info("checkpoint saved", path=str(directory))
        protect = [self.config.load] if self.config.load else []
        checkpoint_rotation.rotate(self.config.save, self.config.save_total_limit, protect)

    def _save_async(self, state: RunState, metrics: dict[str, float], last: bool) -> None:
        """async_save: finish the previous checkpoint, then start this one; only the trainer's
        staging is on this step's path. The last one is finished at once (the run ends with it)."""
        self.finish_background(metrics)
        directory = run_state.checkpoint_dir(self.config.save, state.next_rollout_id)
        snapshot, cursor = self._snapshot(state)
        try:
            reply = self.services.trainer.SaveCheckpoint(
                self._trainer_save_request(directory, state, async_save=True)
            )
        except grpc.RpcError as exc:
            self._failed(exc, directory)
            return
        complete = functools.partial(self._complete, directory, snapshot, cursor)
        self.background.start(directory, reply.checkpoint_dir, complete)
        if last:
            self.finish_background(metrics)

    def finish_background(self, metrics: dict[str, float]) -> None:
        """Wait for the checkpoint in flight; its write time and size go into `metrics`."""
        try:
            done = self.background.finish()
        except (grpc.RpcError, OSError) as exc:
            self._failed(exc, self.background.directory)
            return
        if done is not None:
            metrics["perf/save_write_time"] = done.write_seconds
            metrics["checkpoint/bytes"] = float(tree_bytes(done.directory))

    def abandon(self) -> None:
        """The run attempt ended: a background write that still finishes completes nothing."""
        self.background.abandon()

    def mark_data_position(self, step: int, state: RunState) -> None:
        """Record the data position before step `step`'s data is fetched (for a checkpoint)."""
        if self.config.save:
            position = (
                self.data_cursor(),
                state.next_batch_id,
                state.next_group_index,
                list(state.partial_groups),
            )
            with self._positions_lock:
                self._data_positions[step] = position

    def forget_data_positions(self, through_step: int) -> None:
        """Drop the positions of steps up to `through_step`: no save needs them any more."""
        with self._positions_lock:
            for step in [s for s in self._data_positions if s <= through_step]:
                del self._data_positions[step]

    def data_cursor(self) -> str | None:
        """The dataloader's cursor now; None without a dataloader or without saves."""
        if self.services.dataloader is None or not self.config.save:
            return None
        return self.services.dataloader.GetState(dataloader_pb2.GetStateRequest()).state_json
