"""Checkpoint time on the step's critical path: a synchronous save against async_save.

One trainer rank (the trainer's own engine, fp32, full fine-tuning with AdamW) in a fresh
process per model. After a warm-up step it takes a synchronous save (dcp write, then meta +
manifest + rename: what the step waited for before async_save), then an async one: the staging
copy is what the step waits for; a training step then runs while the write goes on, and the
write's own time, the step's time against a step without a write in the background, and the
size of the staged copy are recorded. Models: the "small" preset (~50M) and, unless --quick,
the 12-layer cut of the Qwen3-0.6B shape (~344M, vocabulary 151,936) of issue #26.

    flock /tmp/rollway-bigmem.lock .venv/bin/python -m bench.run async_save [--quick]
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.harness import BenchResult
from rollway.common.config import from_dict, to_dict
from rollway.common.manifest import tree_bytes
from rollway.demo.tiny_model import make_tiny_model
from rollway.trainer import checkpoint
from rollway.trainer.config import TrainerConfig
from rollway.trainer.distributed import init_process_group
from rollway.trainer.engine import TrainerEngine
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.train_plan import plan_train_steps

QWEN3_06B_12_LAYERS = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
MODELS = {"small": {"preset": "small"}, "qwen3-0.6b-12-layers": QWEN3_06B_12_LAYERS}


def _batch(seed: int) -> list[SequenceItem]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, 250, (8, 64), generator=generator).tolist()
    return [SequenceItem(k, row, 8, [1] * 56) for k, row in enumerate(tokens)]


def _staged_bytes(engine: TrainerEngine) -> int:
    """What checkpoint.stage copies: every parameter and every optimizer state tensor."""
    optimizer_state = engine.optimizer.state.values()
    states = [t for state in optimizer_state for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in [*engine.model.parameters(), *states])


def _save_dir(root: Path, engine: TrainerEngine) -> Path:
    tmp = checkpoint.temp_dir(root, engine.global_step)
    tmp.mkdir(parents=True)
    return tmp


def _rank_main(rank: int, store_path: str, spec: dict, out_file: str) -> None:
    info = init_process_group(dist.FileStore(store_path, 1), 0, 1, 600.0)
    try:
        config = from_dict(TrainerConfig, spec["config"])
        engine = TrainerEngine(config, info)
        engine.init(to_dict(config))

        def step(seed: int) -> float:
            per_rank, _ = plan_train_steps(_batch(seed), config, 1)
            started = time.perf_counter()
            engine.train(per_rank[0])
            return time.perf_counter() - started

        step(0)
        plain_step = step(1)
        root = Path(spec["root"])
        tmp = _save_dir(root, engine)
        started = time.perf_counter()
        engine.save(str(tmp), hf_export=False)
        final = checkpoint.finalize(tmp, root, engine.global_step, {"global_step": engine.global_step})
        sync_seconds = time.perf_counter() - started
        size = tree_bytes(final)
        step(2)
        tmp = _save_dir(root, engine)
        started = time.perf_counter()
        engine.save(str(tmp), hf_export=False, async_save=True)
        staging_seconds = time.perf_counter() - started
        step_during_write = step(3)
        outcome = engine.writer.wait()
        started = time.perf_counter()
        checkpoint.finalize(tmp, root, engine.global_step, {"global_step": engine.global_step})
        finalize_seconds = time.perf_counter() - started
        row = {
            "parameters_m": engine.num_parameters / 1e6,
            "checkpoint_gb": size / 1e9,
            "sync_save_s": sync_seconds,
            "async_blocking_s": staging_seconds,
            "async_write_s": outcome.write_seconds,
            "async_finalize_s": finalize_seconds,
            "staged_copy_gib": _staged_bytes(engine) / 2**30,
            "step_s": plain_step,
            "step_during_write_s": step_during_write,
        }
        Path(out_file).write_text(json.dumps(row))
    finally:
        dist.destroy_process_group()


def run_model(model_dir: Path, root: Path) -> dict:
    spec = {
        "config": {"hf_checkpoint": str(model_dir), "dtype": "float32", "loss_type": "sft_loss", "lr": 1e-5},
        "root": str(root),
    }
    out_file = root.parent / f"row-{uuid.uuid4().hex}.json"
    mp.start_processes(
        _rank_main,
        args=(str(root.parent / f"store-{uuid.uuid4().hex}"), spec, str(out_file)),
        nprocs=1,
        start_method="spawn",
        join=True,
    )
    return json.loads(out_file.read_text())


def run(quick: bool) -> BenchResult:
    rows = []
    names = ["small"] if quick else list(MODELS)
    for name in names:
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
            model_dir = make_tiny_model(Path(tmp, "model"), seed=0, **MODELS[name])
            rows.append({"model": name, **run_model(model_dir, Path(tmp, "save"))})
    return BenchResult(
        name="async_save",
        rows=rows,
        units={
            "parameters_m": "M",
            "checkpoint_gb": "GB",
            "sync_save_s": "s",
            "async_blocking_s": "s",
            "async_write_s": "s",
            "async_finalize_s": "s",
            "staged_copy_gib": "GiB",
            "step_s": "s",
            "step_during_write_s": "s",
        },
        config={"dtype": "float32", "ranks": 1, "optimizer": "AdamW", "tokens_per_step": 8 * 64},
        notes=(
            "sync_save_s: the whole save on the step's path (dcp write + manifest + rename); "
            "async_blocking_s: what a step waits with async_save (the staging copy); async_write_s: "
            "the background dcp write; async_finalize_s: manifest + rename after it (background too); "
            "step_during_write_s: a training step while the write runs (2 cores shared)."
        ),
    )
