"""One run: the SFT loop or the RL loop (sync or async), with eval, checkpoints and debug modes.

RL, one step (rollout k):

    dataloader.NextBatch ──> rollout.Generate (stream) ──> dynamic sampling ──> advantages
         ^  refill while groups were dropped                                      │
         │                                                                         v
    checkpoint? <── weight sync v+1 (every update_weights_interval) <── trainer.TrainStep

Async (--async): one background worker generates the next rollouts, in order, while rollout k
trains: up to max_weight_staleness rollouts ahead (k+1 .. k+max_weight_staleness).
Generation of rollout j is admitted only when the engines serve a weight version of at least
j + 1 - max_weight_staleness, so staleness is bounded without dropping samples:

    main:   train k ──> sync v+1 ──> train k+1 ──> sync ──> ...
    worker:   generate k+1 ──> generate k+2 ──> ...  (queued at most max_weight_staleness ahead)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc

from rollway.common.log import bind_run_context, get_logger
from rollway.common.manifest import remove_partial_dirs, tree_bytes
from rollway.common.structs import to_struct
from rollway.common.tracing import in_current_context, tracer
from rollway.common.v1 import common_pb2
from rollway.coordinator import checkpoint_rotation, debug_data, run_state
from rollway.coordinator.background_checkpoint import BackgroundCheckpoint
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.dashboard import rollout_samples
from rollway.coordinator.engine_healer import EngineHealer
from rollway.coordinator.eval_schedule import evaluates_before
from rollway.coordinator.evaluation import Evaluator
from rollway.coordinator.metrics import MetricsSink, ProgressLine
from rollway.coordinator.prompt_ledger import PromptLedger
from rollway.coordinator.remote import Services
from rollway.coordinator.rollout_collect import Rollout, collect_rollout
from rollway.coordinator.run_state import RunState
from rollway.coordinator.weight_sync import WeightSyncSettings, init_weight_group, sync_weights
from rollway.dataloader.v1 import dataloader_pb2
from rollway.trainer.v1 import trainer_pb2

log = get_logger("rollway.coordinator.run")


class RunStopped(Exception):
    """StopRun was called."""


class Run:
    """Drives one run over connected services; `execute()` returns the final metrics."""

    def __init__(
        self,
        config: CoordinatorConfig,
        services: Services,
        run_dir: Path,
        *,
        evaluator: Evaluator | None = None,
        stop: threading.Event | None = None,
        progress: bool = True,
        notice: Callable[[str], None] = lambda line: None,
    ):
        """`notice(line)`: told what the run survives (a checkpoint skipped on resume)."""
        self.config = config
        self.services = services
        self.run_dir = Path(run_dir)
        self.evaluator = evaluator
        self.notice = notice
        self.stop = stop or threading.Event()
        self.sink = MetricsSink(self.run_dir)
        self.ledger = PromptLedger(self.run_dir)
        self.rollout_samples = rollout_samples.open_store(self.run_dir, config)  # the dashboard's
        self.state = RunState()
        self.progress = (
            ProgressLine(self.total_steps(), eval_interval=config.eval_interval) if progress else None
        )
        self.sync_settings = WeightSyncSettings(
            transport=config.update_weight_transport,
            bucket_size_bytes=config.update_weight_buffer_size,
            timeout_seconds=config.update_weight_timeout,
            disk_path=str(self.run_dir / "weights"),
            master_address=config.weight_master_address,
            master_port=config.update_weight_master_port,
        )
        self.final_metrics: dict[str, float] = {}
        self.last_step_metrics: dict[str, float] = {}  # of the latest training step (GetRun)
        self.hf_export_dir = ""
        self.checkpoint_dir = ""  # the newest complete run checkpoint this run wrote
        self.background_checkpoint = BackgroundCheckpoint(services.trainer)  # async_save's
        self.fault_metrics: dict[str, float] = {}  # restarts so far, set by the supervision (runs.py)
        # Told where the run goes on from (the next step, 0-based, and the checkpoint or None):
        # the supervision (runs.py) reports a recovery's resume point with it.
        self.on_resume: Callable[[int, Path | None], None] = lambda next_step, directory: None
        # Data position (dataloader cursor, next batch id, next group index, carried groups) just
        # before the data of step k was fetched, by k: a checkpoint after step k - 1 stores that of
        # step k, as batches are fetched ahead (SFT prefetch, async generation), so a resume
        # neither skips nor repeats data.
        self._data_positions: dict[int, tuple[str | None, int, int, list]] = {}
        self._positions_lock = threading.Lock()  # the generate worker records them too
        # Held while the trainer's weights differ from state.weight_version's (a training step
        # and its sync) and during any push: the engine healer pushes only between those.
        self._weights_lock = threading.Lock()
        self._trainer_ahead = False  # trained since the last push (update_weights_interval > 1)

    # --- setup ---
    def total_steps(self) -> int:
        return self.config.num_rollout

    @property
    def uses_rollout(self) -> bool:
        return not self.config.train_only

    @property
    def uses_trainer(self) -> bool:
        return not self.config.debug_rollout_only

    def _resume(self) -> None:
        if self.config.save:  # saves that crashed half-way; nothing saves under `save` yet
            removed = remove_partial_dirs(Path(self.config.save))
            if removed:
                log.info("removed partial checkpoint directories", paths=[str(p) for p in removed])
        source = self.config.load or self.config.save
        restore = functools.partial(run_state.restore_services, self.services, self.uses_trainer)
        resumed = run_state.resume(source, restore) if source else None  # falls back past corrupt ones
        # Steps from the resume point on are redone: their records are replaced, not repeated.
        next_step = resumed.state.next_rollout_id if resumed is not None else 0
        self.sink.truncate_from(next_step)
        self.ledger.truncate_from(next_step)
        self.on_resume(next_step, resumed.directory if resumed is not None else None)
        if resumed is None:
            if self.config.load:
                raise FileNotFoundError(f"load: no complete run checkpoint under {self.config.load}")
            return
        self.state = resumed.state
        self.state.restore_rng()
        for reason in resumed.skipped:
            self.notice(f"checkpoint skipped: {reason}")
        if resumed.skipped:
            self.notice(f"resumed from the older checkpoint {resumed.directory}")
        log.info("resumed", checkpoint=str(resumed.directory), next_rollout_id=self.state.next_rollout_id,
                 num_skipped_checkpoints=len(resumed.skipped))  # fmt: skip

    def _checkpoint(self) -> Path | None:
        """Write a run checkpoint, then delete the ones past save_total_limit; the directory
        written, or None when the write failed and on_checkpoint_error says continue."""
        directory = run_state.checkpoint_dir(self.config.save, self.state.next_rollout_id)
        try:
            self._write_checkpoint(directory)
        except (grpc.RpcError, OSError) as exc:
            return self._checkpoint_failed(exc, directory)
        return directory

    def _checkpoint_failed(self, exc: grpc.RpcError | OSError, directory: Path) -> None:
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

    def _write_checkpoint(self, directory: Path) -> None:
        state, cursor = self._checkpoint_state()
        if self.uses_trainer:
            self.services.trainer.SaveCheckpoint(self._trainer_save_request(directory, async_save=False))
        self._complete_checkpoint(directory, state, cursor)

    def _trainer_save_request(self, directory: Path, async_save: bool) -> trainer_pb2.SaveCheckpointRequest:
        # The rollout it was saved for: a resume checks it against coordinator.json.
        extra_state = to_struct({"next_rollout_id": self.state.next_rollout_id})
        return trainer_pb2.SaveCheckpointRequest(
            path=str(directory / "trainer"), extra_state=extra_state, async_save=async_save
        )

    def _checkpoint_state(self) -> tuple[RunState, str | None]:
        """The run state and data cursor a checkpoint taken now stores."""
        state = dataclasses.replace(self.state)
        with self._positions_lock:
            position = self._data_positions.get(self.state.next_rollout_id)
        cursor = self._data_cursor() if position is None else position[0]
        if position is not None:
            _, state.next_batch_id, state.next_group_index, state.partial_groups = position
        return state, cursor

    def _complete_checkpoint(self, directory: Path, state: RunState, cursor: str | None) -> None:
        """coordinator.json, manifest and latest pointer (the checkpoint counts from here), then
        the rotation past save_total_limit."""
        run_state.write_checkpoint(directory, state, cursor)
        self.checkpoint_dir = str(directory)
        log.info("checkpoint saved", path=str(directory))
        protect = [self.config.load] if self.config.load else []
        checkpoint_rotation.rotate(self.config.save, self.config.save_total_limit, protect)

    def _checkpoint_async(self, metrics: dict[str, float], last: bool) -> None:
        """async_save: finish the previous checkpoint, then start this one; only the trainer's
        staging is on this step's path. The last one is finished at once (the run ends with it)."""
        self._finish_background_checkpoint(metrics)
        directory = run_state.checkpoint_dir(self.config.save, self.state.next_rollout_id)
        state, cursor = self._checkpoint_state()
        try:
            reply = self.services.trainer.SaveCheckpoint(
                self._trainer_save_request(directory, async_save=True)
            )
        except grpc.RpcError as exc:
            self._checkpoint_failed(exc, directory)
            return
        complete = functools.partial(self._complete_checkpoint, directory, state, cursor)
        self.background_checkpoint.start(directory, reply.checkpoint_dir, complete)
        if last:
            self._finish_background_checkpoint(metrics)

    def _finish_background_checkpoint(self, metrics: dict[str, float]) -> None:
        """Wait for the checkpoint in flight; its write time and size go into `metrics`."""
        try:
            done = self.background_checkpoint.finish()
        except (grpc.RpcError, OSError) as exc:
            self._checkpoint_failed(exc, self.background_checkpoint.directory)
            return
        if done is not None:
            metrics["perf/save_write_time"] = done.write_seconds
            metrics["checkpoint/bytes"] = float(tree_bytes(done.directory))

    def _mark_data_position(self, step: int) -> None:
        """Record the data position before step `step`'s data is fetched (for a checkpoint)."""
        if self.config.save:
            position = (
                self._data_cursor(),
                self.state.next_batch_id,
                self.state.next_group_index,
                list(self.state.partial_groups),
            )
            with self._positions_lock:
                self._data_positions[step] = position

    def _data_cursor(self) -> str | None:
        if self.services.dataloader is None or not self.config.save:
            return None
        return self.services.dataloader.GetState(dataloader_pb2.GetStateRequest()).state_json

    def _push_weights(self) -> dict[str, float]:
        self.state.weight_version += 1
        return sync_weights(self.services, self.state.weight_version, self.sync_settings)

    # --- the run ---
    def execute(self) -> dict[str, float]:
        bind_run_context(run_id=self.run_dir.name)
        try:
            self._resume()  # the services were given the run's settings at its start (run_start.py)
            if self.config.is_sft:
                self._sft_loop()
            else:
                self._rl_loop()
            self._finish_background_checkpoint(self.final_metrics)  # a run stopped between saves
            if self.config.save_hf and self.uses_trainer:
                request = trainer_pb2.ExportHFRequest(path=self.config.save_hf)
                self.hf_export_dir = self.services.trainer.ExportHF(request).hf_dir
            return self.final_metrics
        finally:
            self.background_checkpoint.abandon()
            self.sink.close()
            if self.rollout_samples is not None:
                self.rollout_samples.close()

    def _due(self, interval: int, rollout_id: int) -> bool:
        return interval > 0 and (rollout_id + 1) % interval == 0

    def _after_step(self, rollout_id: int, metrics: dict[str, float], prompts) -> None:
        self.ledger.record(rollout_id, prompts)
        metrics.update(self.fault_metrics)
        self.state.next_rollout_id = rollout_id + 1
        last = rollout_id + 1 == self.total_steps()
        if self.config.save and (self._due(self.config.save_interval, rollout_id) or last):
            # On the step's path: the whole save, or with async_save the wait for the previous
            # write and the trainer's staging (the write itself: perf/save_write_time).
            save_start = time.perf_counter()
            if self.config.async_save and self.uses_trainer:
                self._checkpoint_async(metrics, last)
            else:
                saved = self._checkpoint()
                if saved is not None:
                    metrics["checkpoint/bytes"] = float(tree_bytes(saved))
            metrics["perf/save_time"] = time.perf_counter() - save_start
        record = self.sink.log(rollout_id, metrics)
        self.last_step_metrics = dict(metrics)
        self.final_metrics.update(metrics)
        if self.progress:
            self.progress.update(rollout_id + 1, metrics, at=record["time"])
        with self._positions_lock:
            for step in [s for s in self._data_positions if s <= rollout_id + 1]:
                del self._data_positions[step]

    # --- SFT ---
    def _sft_loop(self) -> None:
        prefetch = ThreadPoolExecutor(1, thread_name_prefix="prefetch")

        def fetch(batch_id: int):
            return self.services.next_batch(self.config.rollout_batch_size, batch_id)

        pending: Future = prefetch.submit(in_current_context(fetch), self.state.next_batch_id)
        try:
            for step in range(self.state.next_rollout_id, self.total_steps() or 1 << 62):
                if self.stop.is_set():
                    raise RunStopped()
                bind_run_context(step=step)
                batch = pending.result()
                if not batch.items:
                    break
                self.state.next_batch_id += 1
                self._mark_data_position(step + 1)
                # One trace per step: the next batch's fetch (overlapping training) and TrainStep.
                with tracer("rollway.coordinator").start_as_current_span(
                    "sft_step", attributes={"step": step}
                ):
                    pending = prefetch.submit(in_current_context(fetch), self.state.next_batch_id)
                    self._sft_step(step, batch)
                if batch.exhausted:
                    break
        finally:
            prefetch.shutdown(wait=False, cancel_futures=True)

    def _sft_step(self, step: int, batch: dataloader_pb2.NextBatchResponse) -> None:
        samples = [
            common_pb2.Sample(
                index=i, response_token_ids=item.token_ids, loss_mask=item.loss_mask, source=item.source
            )
            for i, item in enumerate(batch.items)
        ]
        start = time.perf_counter()
        reply = self.services.train_step(step, samples, {"loss_type": "sft_loss"})
        self.state.tokens_seen += sum(len(s.response_token_ids) for s in samples)
        self.state.epoch = batch.epoch
        # The trainer reports train/*; an SFT run reports them as sft/* (Miles' SFT names).
        metrics = {
            f"sft/{k.split('/', 1)[1]}" if k.startswith("train/") else k: v for k, v in reply.metrics.items()
        }
        metrics.update(
            {
                "sft/tokens_seen": float(self.state.tokens_seen),
                "sft/epoch": float(batch.epoch),
                "data/prefetch_queue_depth": float(batch.prefetch_queue_depth),
                "perf/train_time": time.perf_counter() - start,
                "perf/step_time": time.perf_counter() - start,
            }
        )
        self._determinism(step, samples, metrics)
        self._after_step(step, metrics, [(item.source, item.epoch, item.row_index) for item in batch.items])

    # --- RL ---
    def _generate(self, rollout_id: int) -> Rollout:
        """Rollout `rollout_id`; rollouts are generated one at a time, in order (here or on the
        generate worker), so the data position after this one is where the next one starts."""
        rollout = collect_rollout(self.config, self.services, self.state, rollout_id)
        self._mark_data_position(rollout_id + 1)
        return rollout

    def _rl_loop(self) -> None:
        c = self.config
        if self.uses_rollout and self.uses_trainer:
            # One trace for the group and the first push: both sides of the rendezvous in it.
            with tracer("rollway.coordinator").start_as_current_span("initial_weight_sync"):
                init_weight_group(self.services, self.sync_settings)
                self._push_weights()  # engines and trainer start identical, also after a resume
                if c.check_weight_update_equal:
                    self._check_weight_update_equal()
        # One worker: rollouts are generated in order (data order, carried partial groups).
        generator = ThreadPoolExecutor(1, thread_name_prefix="generate")
        ahead: dict[int, Future] = {}  # rollouts queued or generated ahead, by id (contiguous)
        healer = None
        if self.uses_rollout and self.uses_trainer:
            # Version 0 tells the healer to wait: the trainer's weights are not a pushed version.
            healer = EngineHealer(
                self.services, self.sync_settings, self._healable_version, self._weights_lock
            )
            healer.start()
        try:
            for rollout_id in range(self.state.next_rollout_id, self.total_steps()):
                if self.stop.is_set():
                    raise RunStopped()
                bind_run_context(step=rollout_id, weight_version=self.state.weight_version)
                # One trace per step: every service call below is a child span of this one.
                with tracer("rollway.coordinator").start_as_current_span(
                    "rl_step", attributes={"step": rollout_id}
                ):
                    self._rl_step(rollout_id, ahead, generator)
            if self.evaluator and self.total_steps() > 0:
                final = self.evaluator.evaluate("eval-final")
                self.sink.log(self.total_steps(), final)
                self.final_metrics.update(final)
        finally:
            if healer is not None:
                healer.stop()
            generator.shutdown(wait=True, cancel_futures=True)

    def _rl_step(self, rollout_id: int, ahead: dict[int, Future], generator: ThreadPoolExecutor) -> None:
        """Rollout `rollout_id` (generated now, or earlier in the background), train, sync.

        In async mode, first queues the next rollouts on the generate worker (`ahead`), up to
        max_weight_staleness ahead of this one, as far as admission allows.
        """
        c = self.config
        metrics: dict[str, float] = {}
        if self.evaluator and evaluates_before(rollout_id, c.eval_interval):
            metrics.update(self.evaluator.evaluate(f"eval-{rollout_id}"))  # perf/eval_time: its own
        step_start = time.perf_counter()  # the step's time leaves the evaluation out (step_pace.py)
        # `ahead` holds contiguous ids from rollout_id on: when this one is not there, none is.
        prefetched = ahead.pop(rollout_id, None)
        rollout = prefetched.result() if prefetched else self._generate(rollout_id)
        if c.async_mode:
            self._queue_ahead(rollout_id, ahead, generator)
        metrics.update(rollout.metrics)
        metrics["perf/rollout_time"] = rollout.generate_seconds
        if c.save_debug_rollout_data:
            debug_data.save_rollout(c.save_debug_rollout_data, rollout_id, rollout.samples)
        services = self.services if self.uses_trainer else None  # before training changes the policy:
        rollout_samples.record_step(self.rollout_samples, rollout_id, rollout.samples, services, c)
        if self.uses_trainer:
            with self._weights_lock:
                metrics.update(self._train(rollout))
                self._trainer_ahead = True
                if self.uses_rollout and self._due(c.update_weights_interval, rollout_id):
                    # An async generation in flight is paused (WAIT) around the sync, not dropped.
                    metrics.update(self._push_weights())
                    self._trainer_ahead = False
        metrics["rollout/weight_version"] = float(self.state.weight_version)
        metrics["perf/step_time"] = time.perf_counter() - step_start
        self._determinism(rollout_id, rollout.samples, metrics)
        self._after_step(rollout_id, metrics, rollout.prompts)

    def _healable_version(self) -> int:
        """The version the trainer's weights are now, or 0 while they are ahead of every push."""
        return 0 if self._trainer_ahead else self.state.weight_version

    def _queue_ahead(self, rollout_id: int, ahead: dict[int, Future], generator: ThreadPoolExecutor) -> None:
        """Queue rollouts rollout_id+1 .. rollout_id+max_weight_staleness that are admitted now."""
        next_id = max(ahead, default=rollout_id) + 1
        last = min(rollout_id + self.config.max_weight_staleness, self.total_steps() - 1)
        while next_id <= last and self._admitted(next_id):
            ahead[next_id] = generator.submit(in_current_context(self._generate), next_id)
            next_id += 1

    def _admitted(self, rollout_id: int) -> bool:
        """Async admission: the engines' weights may lag the rollout id by max_weight_staleness."""
        return self.state.weight_version >= rollout_id + 1 - self.config.max_weight_staleness

    def _train(self, rollout: Rollout) -> dict[str, float]:
        start = time.perf_counter()
        reply = self.services.train_step(rollout.rollout_id, rollout.samples)
        metrics = dict(reply.metrics)
        staleness = [self.state.weight_version - s.weight_version for s in rollout.samples]
        if staleness:
            metrics["rollout/staleness/max"] = float(max(staleness))
            metrics["rollout/staleness/mean"] = float(sum(staleness) / len(staleness))
            # Miles' names for the same lag (its fully-async rollout).
            metrics["rollout/fully_async/max_staleness"] = metrics["rollout/staleness/max"]
            metrics["rollout/fully_async/avg_staleness"] = metrics["rollout/staleness/mean"]
        metrics["perf/train_time"] = time.perf_counter() - start
        tokens = sum(len(s.response_token_ids) + len(s.prompt_token_ids) for s in rollout.samples)
        metrics["perf/tokens_per_s"] = tokens / max(metrics["perf/train_time"], 1e-9)
        return metrics

    def _check_weight_update_equal(self) -> None:
        from rollway.coordinator.weight_check import check_weight_update_equal

        check_weight_update_equal(self.services, self.state, self.sync_settings)

    def _determinism(self, step: int, samples, metrics: dict[str, float]) -> None:
        if not self.config.debug_determinism:
            return
        data = hashlib.sha256()
        for s in samples:
            data.update(bytes(str((list(s.prompt_token_ids), list(s.response_token_ids))), "utf8"))
        record = {
            "step": step,
            "data": data.hexdigest(),
            "loss": metrics.get("train/loss", metrics.get("sft/loss")),
        }
        if self.uses_trainer:
            reply = self.services.trainer.WeightChecksum(trainer_pb2.WeightChecksumRequest(dtype="float32"))
            record["weights"] = reply.checksum.digest
        with (self.run_dir / "determinism.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
