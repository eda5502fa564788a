"""A run's rollout samples, kept per step for the dashboard's Rollouts view (live and finished runs).

    run thread: RolloutSampleStore.record(step, samples) ──> first K groups, (optional) trainer
        log-probs and entropy of their tokens ──> bounded queue ──> writer thread:
        RUN_DIR/rollouts/step_000012.jsonl.gz (one JSON line per sample), oldest steps pruned

Bounded twice: at most `max_groups` groups per step and the last `keep_steps` steps. The run
thread never waits on the disk: when the writer falls behind (a full queue), that step's samples
are dropped and logged. This is not the replay dump (--save-debug-rollout-data, bit-exact protos
of every sample for training again): it holds what a person reads, with per-token values the
trainer computes, and only a sample of the groups.
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import re
import threading
from collections.abc import Sequence
from pathlib import Path

from rollway.common.log import get_logger
from rollway.common.v1 import common_pb2

log = get_logger("rollway.coordinator.dashboard.rollout_samples")

ROLLOUTS_DIR = "rollouts"
STEP_FILE = re.compile(r"step_(\d+)\.jsonl\.gz")
QUEUE_STEPS = 4  # steps waiting for the writer before new ones are dropped
DIGITS = 5  # per-token values are rounded: a colour and a hover value need no more


def step_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / ROLLOUTS_DIR / f"step_{step:06d}.jsonl.gz"


def stored_steps(run_dir: Path) -> list[int]:
    """Steps with stored samples, ascending."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := STEP_FILE.fullmatch(p.name)))


def read_step(run_dir: Path, step: int) -> list[dict]:
    """The stored samples of one step (FileNotFoundError when none are kept for it)."""
    with gzip.open(step_path(run_dir, step), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _rounded(values: Sequence[float]) -> list[float]:
    return [round(float(v), DIGITS) for v in values]


def sample_record(
    sample: common_pb2.Sample, trainer_log_probs: Sequence[float] = (), entropy: Sequence[float] = ()
) -> dict:
    """One sample as stored: what the Rollouts view shows, per-token values rounded."""
    rollout_log_probs = _rounded(sample.rollout_log_probs)
    record = {
        "group_index": sample.group_index,
        "index": sample.index,
        "prompt_token_ids": list(sample.prompt_token_ids),
        "response_token_ids": list(sample.response_token_ids),
        "response_text": sample.response_text,
        "label": sample.label,
        "source": sample.source,
        "reward": sample.reward,
        "raw_reward": sample.raw_reward,
        # GRPO-style estimators broadcast one value to every token; per-token ones vary, and the
        # first token's value is what the group normalisation gave the sample.
        "advantage": float(sample.advantages[0]) if sample.advantages else 0.0,
        "weight_version": sample.weight_version,
        "finish_reason": common_pb2.FinishReason.Name(sample.finish_reason).removeprefix("FINISH_REASON_"),
        "reward_error": sample.reward_error,
        "rollout_log_probs": rollout_log_probs,
    }
    if trainer_log_probs:
        record["trainer_log_probs"] = _rounded(trainer_log_probs)
        record["train_rollout_log_prob_diff"] = [
            round(t - r, DIGITS) for t, r in zip(record["trainer_log_probs"], rollout_log_probs, strict=False)
        ]
    if entropy:
        record["entropy"] = _rounded(entropy)
    return record


def first_groups(samples: Sequence[common_pb2.Sample], max_groups: int) -> list[common_pb2.Sample]:
    """The samples of the first `max_groups` groups (all when max_groups is 0), in batch order."""
    kept: list[int] = []
    for s in samples:
        if s.group_index not in kept:
            kept.append(s.group_index)
    chosen = set(kept if max_groups <= 0 else kept[:max_groups])
    return [s for s in samples if s.group_index in chosen]


class RolloutSampleStore:
    """Writes a bounded sample of each step's rollouts to RUN_DIR/rollouts/ from its own thread."""

    def __init__(self, run_dir: Path, *, max_groups: int, keep_steps: int):
        self.run_dir = Path(run_dir)
        self.max_groups = max_groups
        self.keep_steps = keep_steps
        self.num_dropped_steps = 0
        self._queue: queue.Queue = queue.Queue(QUEUE_STEPS)
        self._thread = threading.Thread(target=self._write_loop, name="rollout-samples", daemon=True)
        self._thread.start()

    def record(self, step: int, records: list[dict]) -> bool:
        """Queue one step's sample records for writing; False (and dropped) when the writer lags."""
        try:
            self._queue.put_nowait((step, records))
            return True
        except queue.Full:
            self.num_dropped_steps += 1
            log.warning("rollout samples dropped: the writer is behind", step=step)
            return False

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (at most `timeout` seconds), then stop the writer."""
        try:
            self._queue.put((None, None), timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _write_loop(self) -> None:
        while True:
            step, records = self._queue.get()
            if step is None:
                return
            try:
                self._write(step, records)
            except Exception as exc:  # a full disk costs the dashboard a step, never the run
                log.warning("rollout samples not written", step=step, error=str(exc))

    def _write(self, step: int, records: list[dict]) -> None:
        path = step_path(self.run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with gzip.open(tmp, "wt", compresslevel=6) as f:
            for r in records:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        os.replace(tmp, path)  # readers see a whole step or none
        if self.keep_steps > 0:
            # A resumed run redoes steps: only steps below the newest count as older.
            older = [s for s in stored_steps(self.run_dir) if s < step]
            for old in older[: max(len(older) - (self.keep_steps - 1), 0)]:
                step_path(self.run_dir, old).unlink(missing_ok=True)


def trainer_values(services, samples: Sequence[common_pb2.Sample], temperature: float) -> list:
    """(log_probs, entropy) per sample from the trainer's current (pre-update) policy: one forward
    pass over `samples` (ComputeLogProbs), so the view can show where trainer and engine disagree."""
    from rollway.trainer.v1 import trainer_pb2

    def requests():
        header = trainer_pb2.ComputeLogProbsHeader(temperature=temperature, with_entropy=True)
        yield trainer_pb2.ComputeLogProbsRequest(header=header)
        for start in range(0, len(samples), 64):
            chunk = trainer_pb2.SampleChunk(samples=samples[start : start + 64])
            yield trainer_pb2.ComputeLogProbsRequest(samples=chunk)

    replies = services.trainer.ComputeLogProbs(requests(), timeout=TRAINER_CALL_SECONDS)
    results = sorted((r for reply in replies for r in reply.results), key=lambda r: r.index)
    return [(list(r.log_probs), list(r.entropy)) for r in results]


TRAINER_CALL_SECONDS = 120.0


def open_store(run_dir: Path, config) -> RolloutSampleStore | None:
    """The run's sample store (None when dashboard_rollout_groups is 0)."""
    if config.dashboard_rollout_groups <= 0:
        return None
    return RolloutSampleStore(
        run_dir, max_groups=config.dashboard_rollout_groups, keep_steps=config.dashboard_rollout_steps
    )


def record_step(store: RolloutSampleStore | None, step: int, samples, services, config) -> None:
    """The run's hook: keep a sample of this step's groups (before training changes the policy).
    `services` is None for a run without a trainer.

    With dashboard_trainer_log_probs the trainer scores the kept samples first; a failure there
    costs the view its trainer columns, never the run."""
    if store is None:
        return
    kept = first_groups(samples, store.max_groups)
    values: list = [((), ())] * len(kept)
    if config.dashboard_trainer_log_probs and services is not None and kept:
        try:
            values = trainer_values(services, kept, config.rollout_temperature)
        except Exception as exc:
            log.warning("trainer log-probs for the dashboard failed", step=step, error=str(exc))
    store.record(step, [sample_record(s, lp, ent) for s, (lp, ent) in zip(kept, values, strict=True)])
