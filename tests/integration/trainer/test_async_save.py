"""async_save on 2 real gloo ranks: the step goes on while the checkpoint is written.

The background write is held open (its `write` wrapped by a gate, the way a test wraps a
component) so that what happens during it is observed by conditions, not by timing: a training
step runs and returns while the write has not started writing, then a second step runs while the
write's own collectives run on their group. The checkpoint that is loaded afterwards holds the
weights and optimizer state of the moment it was staged, bit for bit.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch.distributed as dist
from support.rank_harness import make_config, run_on_ranks

from rollway.common.config import to_dict
from rollway.trainer import checkpoint
from rollway.trainer.engine import TrainerEngine
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.train_plan import plan_train_steps

pytestmark = pytest.mark.slow

GATE_TIMEOUT_S = 60.0


def batch(seed: int) -> list[SequenceItem]:
    return [SequenceItem(k, [1, 40 + k + seed, 50 + k, 51 + seed, 52, 2], 2, [1, 1, 1, 1]) for k in range(4)]


def train(engine: TrainerEngine, items: list[SequenceItem], config) -> dict:
    per_rank, _ = plan_train_steps(items, config, engine.info.world_size)
    return engine.train(per_rank[engine.info.rank])[0]


def fresh_engine(info, config) -> TrainerEngine:
    engine = TrainerEngine(config, info)
    engine.init(to_dict(config))
    return engine


def scenario_step_during_write(info, config, root: str) -> dict:
    engine = fresh_engine(info, config)
    train(engine, batch(0), config)
    entered, release = threading.Event(), threading.Event()
    write = engine.writer.write

    def held_write(staged, directory, group):  # the real write, once the test lets it go
        entered.set()
        if not release.wait(GATE_TIMEOUT_S):
            raise TimeoutError("the test never released the write")
        write(staged, directory, group)

    engine.writer.write = held_write
    tmp = Path(root) / ".tmp-iter_0000001-test"
    if info.rank == 0:
        tmp.mkdir(parents=True)
    dist.barrier()
    staged_checksum = engine.checksum("float32")
    errors = engine.save(str(tmp), hf_export=False, async_save=True)
    assert entered.wait(GATE_TIMEOUT_S)
    step_during_write = train(engine, batch(1), config)
    in_flight_after_step = not engine.writer.pending.done()
    model_written_after_step = (tmp / "model" / ".metadata").exists()
    after_step_checksum = engine.checksum("float32")
    release.set()
    train(engine, batch(2), config)  # its collectives interleave with the write's, on two groups
    outcome = engine.writer.wait()
    final = checkpoint.finalize(tmp, Path(root), 1, {"global_step": 1}) if info.rank == 0 else None
    dist.barrier()
    resumed = fresh_engine(info, config)
    resumed.load(str(Path(root) / checkpoint.iter_dir_name(1)), global_step=1)
    loaded_checksum = resumed.checksum("float32")
    resumed_step = train(resumed, batch(1), config)
    return {
        "errors": errors,
        "in_flight_after_step": in_flight_after_step,
        "model_written_after_step": model_written_after_step,
        "outcome_error": outcome.error,
        "final": str(final),
        "checksums": (staged_checksum, loaded_checksum),
        "after_step": (after_step_checksum, resumed.checksum("float32")),
        "steps": (step_during_write, resumed_step),
    }


def test_a_step_runs_while_the_checkpoint_is_written_and_the_checkpoint_holds_the_staged_state(
    tiny_model_dir, tmp_path
):
    config = make_config(tiny_model_dir, lr=1e-2)
    root = tmp_path / "save"
    (result,) = run_on_ranks(
        2, [(scenario_step_during_write, {"config": config, "root": str(root)})], tmp_path
    )
    assert result["errors"] == [] and result["outcome_error"] == ""
    # The step returned while the write was still held open: the write is off its critical path.
    assert result["in_flight_after_step"] is True
    assert result["model_written_after_step"] is False
    assert result["final"] == str(root / "iter_0000001")
    staged, loaded = result["checksums"]
    assert loaded[0] == staged[0]  # the weights of the moment of the save, not of the later steps
    after_step, resumed_after_step = result["after_step"]
    assert after_step[0] != staged[0]
    # Optimizer state too: the same step from the loaded checkpoint gives the same weights and loss.
    assert resumed_after_step[0] == after_step[0]
    during, resumed = result["steps"]
    assert resumed["train/loss"] == during["train/loss"]
    assert resumed["train/grad_norm"] == during["train/grad_norm"]
