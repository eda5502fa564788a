"""The trainer's logic on rank 0: settings, step planning, idempotency, checkpoint bookkeeping.

    service.py (gRPC) -> TrainerController -> RankRuntime.run(per-rank commands, commands.py)

Everything is validated and planned here before a command is posted, so the ranks only ever
receive work they can do. One lock serialises commands: the ranks run one thing at a time.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollway.common.config import ConfigError, from_dict, to_dict
from rollway.common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from rollway.common.log import get_logger
from rollway.common.manifest import CheckpointError, describe_os_error, tree_bytes
from rollway.trainer import checkpoint
from rollway.trainer.batch import num_loss_tokens
from rollway.trainer.checkpoint_dirs import make_temp_dir, warn_if_short_of_space, write_failed
from rollway.trainer.commands import (
    ActivateAdapter,
    Checksum,
    Command,
    DropAdapter,
    ExportHf,
    ForwardBackward,
    Init,
    Load,
    LogProbs,
    OptimStep,
    Save,
    Train,
)
from rollway.trainer.config import STEP_SETTINGS, TRAINING_SETTINGS, TrainerConfig
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.runtime import RankRuntime
from rollway.trainer.sharding import DTYPE_NAMES
from rollway.trainer.train_plan import plan_log_probs, plan_train_steps

log = get_logger("rollway.trainer.controller")


MAX_STORED_RESULTS = 4096


@dataclass
class StepResult:
    """What a TrainStep returned (kept for retries of the same step_id)."""

    global_step: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SavedCheckpoint:
    """A complete checkpoint: its directory, its background write time (0: written in the
    call) and its size."""

    directory: Path
    write_seconds: float
    size_bytes: int


# Complete checkpoints WaitCheckpoint still answers for (the newest ones this trainer saved).
MAX_REMEMBERED_SAVES = 16


def merge_settings(
    base: TrainerConfig, overrides: dict[str, Any], allowed: frozenset, field_prefix: str
) -> TrainerConfig:
    """`base` with `overrides` applied; a setting outside `allowed` may only repeat its current value."""
    base_values = to_dict(base)
    for raw_key, value in overrides.items():
        key = str(raw_key).replace("-", "_")
        if key in base_values and key not in allowed:
            try:
                same = from_dict(TrainerConfig, {key: value}, base=base) == base
            except ConfigError:
                same = False
            if not same:
                raise InvalidArgument(
                    f"{field_prefix}.{key}", "cannot be changed here (a start-up or run-wide setting)"
                )
    try:
        return from_dict(TrainerConfig, overrides, base=base)
    except ConfigError as exc:
        raise InvalidArgument(f"{field_prefix}.{exc.setting}", exc.problem) from None


class TrainerController:
    """Rank 0's view of the trainer; every public method is one RPC's work."""

    def __init__(self, config: TrainerConfig, runtime: RankRuntime):
        self.startup = config
        self.runtime = runtime
        self.settings: TrainerConfig | None = None
        self.lock = threading.Lock()
        self.results: OrderedDict[int, StepResult] = OrderedDict()
        self.weight_version = 0
        self.last_checkpoint_bytes = 0  # size of the last checkpoint saved (the free-space check)
        # async_save: the write in flight (finished here: manifest, rename, latest pointer), and
        # the checkpoints completed, by directory, for WaitCheckpoint.
        self.pending_save: tuple[Path, Future[SavedCheckpoint]] | None = None
        self.saved: OrderedDict[Path, SavedCheckpoint] = OrderedDict()
        self._finisher = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-finish")
        self.adapter = ""  # the LoRA tenant whose adapters are live ("": the trainer's own)

    @property
    def engine(self):
        return self.runtime.engine

    @property
    def world_size(self) -> int:
        return self.startup.world_size

    def _broadcast(self, command: Command) -> Any:
        """The same command on every rank; rank 0's result."""
        return self.runtime.run([command] * self.world_size)

    # --- LoRA tenants (lora_tenants.py) -----------------------------------------------------
    def _activate(self, adapter: str) -> None:
        """Under self.lock, before a tenant's command: its adapters become the live ones, so
        the command and the activation are one step no other tenant's call comes between."""
        if adapter == self.adapter:
            return
        if not self.startup.lora_rank:
            raise InvalidArgument("adapter", "this trainer trains no LoRA adapters (lora_rank 0)")
        self._broadcast(ActivateAdapter(adapter))
        self.adapter = adapter

    def drop_adapter(self, adapter: str) -> tuple[bool, int]:
        """Forget a tenant's adapters and optimizer state; (was held, tenants still held)."""
        if not adapter:
            raise InvalidArgument("adapter", "must name a tenant (the trainer's own adapters stay)")
        with self.lock:
            held, remaining = self._broadcast(DropAdapter(adapter))
            if adapter == self.adapter:
                self.adapter = ""
            return held, remaining

    # --- Init -----------------------------------------------------------------------------
    def init(self, overrides: dict[str, Any]) -> bool:
        """Apply training settings and build the optimizer; True if nothing changed (a repeat)."""
        settings = merge_settings(self.startup, overrides, TRAINING_SETTINGS, "config")
        with self.lock:
            if self.settings == settings:
                return True
            self._broadcast(Init(to_dict(settings)))
            self.settings = settings
            log.info("initialized", **{k: v for k, v in to_dict(settings).items() if k in TRAINING_SETTINGS})
            return False

    def _require_init(self, what: str) -> TrainerConfig:
        if self.settings is None:
            raise FailedPrecondition(f"{what} before Init: call Init first")
        return self.settings

    # --- TrainStep ------------------------------------------------------------------------
    def stored_result(self, step_id: int) -> StepResult | None:
        return self.results.get(step_id)

    def step_settings(self, overrides: dict[str, Any]) -> TrainerConfig:
        settings = self._require_init("TrainStep")
        return merge_settings(settings, overrides, STEP_SETTINGS, "header.overrides")

    def train_step(
        self, step_id: int, items: list[SequenceItem], settings: TrainerConfig
    ) -> tuple[StepResult, bool]:
        """Train on `items` (already validated); (result, already_applied)."""
        started = time.perf_counter()
        per_rank, efficiency = plan_train_steps(items, settings, self.world_size)
        planned = time.perf_counter() - started
        with self.lock:
            stored = self.results.get(step_id)
            if stored is not None:
                return stored, True
            dispatched = time.perf_counter()
            step_metrics = self.runtime.run([Train(steps) for steps in per_rank])
            ran = time.perf_counter() - dispatched
            metrics = self._summarise(step_metrics, items, efficiency, time.perf_counter() - started)
            metrics["perf/data_time"] = metrics.get("perf/data_time", 0.0) + planned
            # Posting the command to the ranks and collecting rank 0's result (pickling included).
            metrics["perf/dispatch_time"] = max(ran - metrics.get("perf/actor_train_time", ran), 0.0)
            result = StepResult(self.engine.global_step, metrics)
            self.results[step_id] = result
            while len(self.results) > MAX_STORED_RESULTS:
                self.results.popitem(last=False)
            return result, False

    def _summarise(
        self, step_metrics: list[dict[str, float]], items, efficiency: float, elapsed: float
    ) -> dict:
        metrics: dict[str, float] = {}
        for name in dict.fromkeys(name for m in step_metrics for name in m):
            # Per-source losses exist only in the steps that had samples of that source.
            values = [m[name] for m in step_metrics if name in m]
            metrics[name] = values[-1] if name == "train/lr" else sum(values) / len(values)
        num_tokens = sum(len(item) for item in items)
        metrics.update(
            {
                "train/num_samples": float(len(items)),
                "train/num_tokens": float(num_tokens),
                "train/num_loss_tokens": float(sum(num_loss_tokens(item) for item in items)),
                "train/packing_efficiency": efficiency,
                "perf/step_time": elapsed,
                "perf/tokens_per_s": num_tokens / elapsed,
                "perf/tokens_per_gpu_per_sec": num_tokens / elapsed / self.world_size,
            }
        )
        return metrics

    # --- ComputeLogProbs ------------------------------------------------------------------
    def compute_log_probs(
        self, items: list[SequenceItem], temperature: float, with_entropy: bool, use_reference: bool
    ) -> list[tuple[list[float], list[float]]]:
        """Response log-probs (and entropy) per item, in request order (of the reference model
        with `use_reference`: reference.py, built on first use)."""
        layout = plan_log_probs(items, self.settings or self.startup, self.world_size)
        commands = [
            LogProbs(micro_batches, temperature, with_entropy, use_reference) for micro_batches in layout
        ]
        with self.lock:
            results = self.runtime.run(commands)
        return [results[item.index] for item in items]

    # --- ForwardBackward / OptimStep (the Tinker API's split step) -------------------------
    def forward_backward(
        self,
        items: list[SequenceItem],
        loss_fn: str,
        loss_fn_config: dict[str, float],
        forward_only: bool,
        adapter: str = "",
    ) -> list[tuple[list[float], list[float]]]:
        """Per-datum (log-probs, loss terms) in request order; gradients accumulate unless
        `forward_only` (datums.py has validated `items` and the loss)."""
        settings = self._require_init("ForwardBackward")
        layout = plan_log_probs(items, settings, self.world_size)
        # Every rank runs as many micro-batches as the busiest one: FSDP's collectives pair up.
        depth = max(len(micro_batches) for micro_batches in layout)
        commands = [
            ForwardBackward(
                micro_batches + [[] for _ in range(depth - len(micro_batches))],
                loss_fn,
                loss_fn_config,
                forward_only,
            )
            for micro_batches in layout
        ]
        with self.lock:
            self._activate(adapter)
            results = self.runtime.run(commands)
        return [results[item.index] for item in items]

    def optim_step(
        self,
        learning_rate: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        grad_clip_norm: float,
        adapter: str = "",
    ) -> tuple[int, dict[str, float]]:
        """Apply the accumulated gradients; (optimizer steps so far, grad norm and lr)."""
        self._require_init("OptimStep")
        with self.lock:
            self._activate(adapter)
            metrics = self._broadcast(OptimStep(learning_rate, betas, eps, weight_decay, grad_clip_norm))
            return self.engine.global_step, metrics

    # --- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(
        self,
        path: str,
        hf_export: bool,
        extra_state: dict[str, Any],
        async_save: bool = False,
        adapter: str = "",
    ) -> tuple[Path, Path | None, int, float]:
        """Write a checkpoint of the current step under `path`; (dir, hf dir or None, step,
        seconds the ranks were held). With `async_save` the ranks are held only while they stage
        the state; the directory is complete (wait_checkpoint) once the background write ends."""
        settings = self._require_init("SaveCheckpoint")
        if not path:
            raise InvalidArgument("path", "must name a directory")
        root = Path(path)
        self.finish_pending_save()  # one write at a time; a failed one was logged and reported
        with self.lock:
            self._activate(adapter)
            start = time.perf_counter()
            step = self.engine.global_step
            tmp = make_temp_dir(root, step)
            warn_if_short_of_space(root, self.last_checkpoint_bytes)
            errors = self._broadcast(Save(str(tmp), hf_export, async_save))
            if errors:
                raise write_failed(root, tmp, "; ".join(errors))
            meta = {
                "global_step": step,
                "world_size": self.world_size,
                "extra_state": extra_state,
                "weight_version": self.weight_version,
                "step_results": {str(k): to_dict_result(v) for k, v in self.results.items()},
                "settings": {k: v for k, v in to_dict(settings).items() if k in TRAINING_SETTINGS},
                "hf_checkpoint": self.startup.hf_checkpoint,
            }
            final = root / checkpoint.iter_dir_name(step)
            if async_save:
                written = self.engine.writer.pending
                self.pending_save = (
                    final,
                    self._finisher.submit(self._finish_async, tmp, root, meta, written),
                )
            else:
                self._remember(self._finalize(tmp, root, meta, 0.0))
            blocking_seconds = time.perf_counter() - start
        log.info("checkpoint staged" if async_save else "checkpoint saved", directory=str(final), global_step=step,
                 hf_export=hf_export, blocking_seconds=round(blocking_seconds, 3))  # fmt: skip
        return final, (final / "hf") if hf_export else None, step, blocking_seconds

    def _finalize(self, tmp: Path, root: Path, meta: dict[str, Any], write_seconds: float) -> SavedCheckpoint:
        """Meta, manifest, rename into place, latest pointer: the checkpoint is complete."""
        try:
            final = checkpoint.finalize(tmp, root, meta["global_step"], meta)
        except OSError as exc:
            raise write_failed(root, tmp, describe_os_error(exc)) from None
        self.last_checkpoint_bytes = tree_bytes(final)
        log.info("checkpoint complete", directory=str(final), global_step=meta["global_step"],
                 write_seconds=round(write_seconds, 3), size_bytes=self.last_checkpoint_bytes)  # fmt: skip
        return SavedCheckpoint(final, write_seconds, self.last_checkpoint_bytes)

    def _finish_async(self, tmp: Path, root: Path, meta: dict[str, Any], written) -> SavedCheckpoint:
        """The `checkpoint-finish` thread: wait for rank 0's background write (which ends on
        every rank together: dcp gathers every rank's result), then finalize. Nothing marks the
        checkpoint complete before this, so a crash mid-write leaves only the temporary directory."""
        try:
            outcome = written.result()
        except Exception as exc:  # noqa: BLE001 - not a write error: still the save failed
            raise write_failed(root, tmp, f"rank 0: {type(exc).__name__}: {exc}") from None
        if outcome.error:
            raise write_failed(root, tmp, outcome.error)
        try:
            saved = self._finalize(tmp, root, meta, outcome.write_seconds)
        except ResourceExhausted:
            raise
        except Exception:  # no caller is waiting yet: say it here, WaitCheckpoint raises it again
            log.exception("checkpoint finalize failed", directory=str(tmp))
            raise
        self._remember(saved)
        return saved

    def _remember(self, saved: SavedCheckpoint) -> None:
        self.saved[saved.directory] = saved
        while len(self.saved) > MAX_REMEMBERED_SAVES:
            self.saved.popitem(last=False)

    def finish_pending_save(self) -> SavedCheckpoint | None:
        """Wait for the background write in flight, if any (before a save, a load, a shutdown);
        its failure was logged and is WaitCheckpoint's answer, so it is not raised here."""
        if self.pending_save is None:
            return None
        _, future = self.pending_save
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - logged by _finish_async; WaitCheckpoint's to report
            return None

    def wait_checkpoint(self, checkpoint_dir: str) -> SavedCheckpoint:
        """The checkpoint `checkpoint_dir` once complete; its write's error if it failed."""
        directory = Path(checkpoint_dir)
        if self.pending_save is not None and self.pending_save[0] == directory:
            return self.pending_save[1].result()  # ResourceExhausted naming path and errno
        if directory in self.saved:
            return self.saved[directory]
        raise NotFound(f"checkpoint_dir: {checkpoint_dir} was not saved by this trainer since its start")

    def export_hf(self, path: str, adapter: str = "") -> tuple[Path, int]:
        """A Hugging Face export of the current weights (a LoRA tenant's, merged, on a shared
        trainer) into `path`/iter_XXXXXXX and nothing else (no trainer checkpoint); written into
        a temporary directory, then renamed."""
        self._require_init("ExportHF")
        if not path:
            raise InvalidArgument("path", "must name a directory")
        root = Path(path)
        with self.lock:
            self._activate(adapter)
            step = self.engine.global_step
            tmp = make_temp_dir(root, step)
            errors = self._broadcast(ExportHf(str(tmp)))
            if errors:
                raise write_failed(root, tmp, "; ".join(errors))
            final = root / checkpoint.iter_dir_name(step)
            try:
                checkpoint.replace_dir(tmp, final)
            except OSError as exc:
                raise write_failed(root, tmp, describe_os_error(exc)) from None
        log.info("hf export written", directory=str(final), global_step=step, size_bytes=tree_bytes(final))
        return final, step

    def load_checkpoint(self, path: str, adapter: str = "") -> tuple[Path, int, dict[str, Any], list[str]]:
        """Restore model, optimizer, RNG and step from a verified checkpoint.

        (dir, step, extra state, why each newer checkpoint under `path` was skipped)."""
        self._require_init("LoadCheckpoint")
        if not path:
            raise InvalidArgument("path", "must name a checkpoint directory")
        if not Path(path).exists():
            raise NotFound(f"path: {path} does not exist")
        try:
            found = checkpoint.resolve_verified(Path(path))
        except CheckpointError as exc:
            raise FailedPrecondition(f"checkpoint refused: {exc}") from None
        directory, meta = found.directory, found.meta
        for reason in found.skipped:  # loudly: a resume from an older step than the caller expects
            log.warning("newer checkpoint skipped, falling back", reason=reason, loading=str(directory))
        self.finish_pending_save()
        with self.lock:
            self._activate(adapter)
            self._broadcast(Load(str(directory), int(meta["global_step"])))
            self.results = OrderedDict(
                (int(k), StepResult(v["global_step"], v["metrics"]))
                for k, v in meta.get("step_results", {}).items()
            )
            self.weight_version = int(meta.get("weight_version", 0))
        log.info("checkpoint loaded", directory=str(directory), global_step=meta["global_step"])
        return directory, int(meta["global_step"]), meta.get("extra_state", {}), found.skipped

    # --- weights --------------------------------------------------------------------------
    def weight_checksum(self, dtype: str) -> tuple[str, int]:
        """sha256 of the full weights cast to `dtype` (default: the compute dtype)."""
        dtype = dtype or self.startup.dtype
        if dtype not in DTYPE_NAMES:
            raise InvalidArgument("dtype", f"must be one of {', '.join(DTYPE_NAMES)} (got {dtype!r})")
        with self.lock:
            return self._broadcast(Checksum(dtype))


# Errors of a disk that cannot take the checkpoint (full, over quota, file too large).


def to_dict_result(result: StepResult) -> dict[str, Any]:
    return {"global_step": result.global_step, "metrics": result.metrics}
