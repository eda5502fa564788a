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

Resume and saves, with the data position each save stores: run_checkpoints.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from rollway.common.log import bind_run_context, get_logger
from rollway.common.tracing import in_current_context, tracer
from rollway.common.v1 import common_pb2
from rollway.coordinator import debug_data, determinism_log
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.dashboard import rollout_samples
from rollway.coordinator.engine_healer import EngineHealer
from rollway.coordinator.eval_schedule import evaluates_before
from rollway.coordinator.evaluation import Evaluator
from rollway.coordinator.metrics import MetricsSink, ProgressLine
from rollway.coordinator.prompt_ledger import PromptLedger
from rollway.coordinator.remote import Services
from rollway.coordinator.rollout_collect import Rollout, collect_rollout
from rollway.coordinator.run_checkpoints import RunCheckpoints
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
        self.checkpoints = RunCheckpoints(config, services, self.uses_trainer)
        self.fault_metrics: dict[str, float] = {}  # restarts so far, set by the supervision (runs.py)
        # Told where the run goes on from (the next step, 0-based, and the checkpoint or None):
        # the supervision (runs.py) reports a recovery's resume point with it.
        self.on_resume: Callable[[int, Path | None], None] = lambda next_step, directory: None
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

    @property
    def checkpoint_dir(self) -> str:
        """The newest complete run checkpoint this run wrote (a recovery's starts with the last
        attempt's)."""
        return self.checkpoints.directory

    @checkpoint_dir.setter
    def checkpoint_dir(self, directory: str) -> None:
        self.checkpoints.directory = directory

    def _resume(self) -> None:
        resumed = self.checkpoints.resume()
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
            self.checkpoints.finish_background(self.final_metrics)  # a run stopped between saves
            if self.config.save_hf and self.uses_trainer:
                request = trainer_pb2.ExportHFRequest(path=self.config.save_hf)
                self.hf_export_dir = self.services.trainer.ExportHF(request).hf_dir
            return self.final_metrics
        finally:
            self.checkpoints.abandon()
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
            self.checkpoints.save(self.state, metrics, last)
        record = self.sink.log(rollout_id, metrics)
        self.last_step_metrics = dict(metrics)
        self.final_metrics.update(metrics)
        if self.progress:
            self.progress.update(rollout_id + 1, metrics, at=record["time"])
        self.checkpoints.forget_data_positions(rollout_id + 1)

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
                self.checkpoints.mark_data_position(step + 1, self.state)
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
        self.checkpoints.mark_data_position(rollout_id + 1, self.state)
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
        if self.config.debug_determinism:
            trainer = self.services.trainer if self.uses_trainer else None
            determinism_log.record_step(self.run_dir, step, samples, metrics, trainer)
