"""Trainer: SFT tokens/s, peak memory and packing efficiency of the FSDP2 engine.

Configurations: model (the ~1M tiny Qwen3 and the ~51M "small" preset) x layout (packed rows
with position_ids restarting per sample, or one padded row per sample) x ranks (1 or 2 gloo
ranks, each with one thread; on this 2-core machine 2 ranks share the same 2 cores, so they
show the cost of sharding and collectives rather than a speed-up).

Each configuration spawns fresh ranks that build the engine exactly as the service does
(rank 0 loads, FSDP2 shards, set_model_state_dict broadcast), take one warm-up optimizer step,
then time `steps` optimizer steps on a generated SFT batch of variable-length samples (the
length spread is what padding wastes). Micro-batches are formed by token budget
(--use-dynamic-batch-size, --max-tokens-per-gpu), fp32 on CPU.

- tokens_per_s: real (non-pad) tokens trained per second, all ranks together;
- peak_rss_mb: the largest peak RSS of one rank process (ru_maxrss; includes torch itself);
- packing_efficiency: real tokens / tokens in the forward passes (padding, empty micro-batches).
"""

from __future__ import annotations

import json
import os
import random
import resource
import tempfile
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.harness import BenchResult
from rollway.common.config import from_dict, to_dict
from rollway.demo.tiny_model import make_tiny_model
from rollway.trainer.config import TrainerConfig
from rollway.trainer.distributed import init_process_group
from rollway.trainer.engine import TrainerEngine
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.train_plan import plan_train_steps


def make_batch(num_samples: int, min_len: int, max_len: int, seed: int = 0) -> list[SequenceItem]:
    """SFT samples: a prompt of 1/4 of the tokens without loss, the rest with loss."""
    rng = random.Random(seed)
    items = []
    for index in range(num_samples):
        length = rng.randint(min_len, max_len)
        prompt = length // 4
        tokens = [rng.randint(3, 300) for _ in range(length)]
        items.append(SequenceItem(index, tokens, prompt, [1] * (length - prompt)))
    return items


def _rank_main(rank: int, world_size: int, store_path: str, spec: dict, out_file: str) -> None:
    torch.set_num_threads(1)
    info = init_process_group(dist.FileStore(store_path, world_size), rank, world_size, 600.0)
    try:
        config = from_dict(TrainerConfig, spec["config"])
        engine = TrainerEngine(config, info)
        engine.init(to_dict(config))
        items = make_batch(**spec["batch"])
        per_rank, efficiency = plan_train_steps(items, config, world_size)
        engine.train(per_rank[rank])  # warm-up
        dist.barrier()
        started = time.perf_counter()
        for _ in range(spec["steps"]):
            metrics = engine.train(per_rank[rank])
        dist.barrier()
        elapsed = time.perf_counter() - started
        peaks: list = [None] * world_size
        dist.all_gather_object(peaks, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        if rank == 0:
            tokens = sum(len(item) for item in items) * spec["steps"]
            row = {
                "tokens_per_s": tokens / elapsed,
                "step_time_s": elapsed / spec["steps"],
                "peak_rss_mb": max(peaks),
                "packing_efficiency": efficiency,
                "micro_batches_per_rank": len(per_rank[0][0].micro_batches),
                "final_loss": metrics[0]["train/loss"],
                "num_parameters_m": engine.num_parameters / 1e6,
            }
            Path(out_file).write_text(json.dumps(row))
    finally:
        dist.destroy_process_group()


def run_config(model_dir: Path, ranks: int, packing: bool, batch: dict, steps: int, max_tokens: int) -> dict:
    """Spawn `ranks` processes, train, and return rank 0's measurements."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = {
            "config": {
                "hf_checkpoint": str(model_dir),
                "dtype": "float32",
                "packing": packing,
                "use_dynamic_batch_size": True,
                "max_tokens_per_gpu": max_tokens,
                "lr": 1e-4,
                "loss_type": "sft_loss",
            },
            "batch": batch,
            "steps": steps,
        }
        out_file = Path(tmp, "row.json")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.start_processes(
            _rank_main,
            args=(ranks, str(Path(tmp, f"store-{uuid.uuid4().hex}")), spec, str(out_file)),
            nprocs=ranks,
            start_method="spawn",
            join=True,
        )
        return json.loads(out_file.read_text())


def run(quick: bool) -> BenchResult:
    models = {
        "tiny": ({}, {"num_samples": 32, "min_len": 16, "max_len": 256}, 3 if not quick else 2, 1024),
        "small": ({"preset": "small"}, {"num_samples": 8, "min_len": 32, "max_len": 256}, 2, 1024),
    }
    if quick:
        models.pop("small")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (preset, batch, steps, max_tokens) in models.items():
            model_dir = make_tiny_model(Path(tmp, name), seed=0, **preset)
            for ranks in (1, 2):
                for packing in (True, False):
                    measured = run_config(model_dir, ranks, packing, batch, steps, max_tokens)
                    rows.append(
                        {
                            "model": name,
                            "ranks": ranks,
                            "layout": "packed" if packing else "padded",
                            **measured,
                        }
                    )
    return BenchResult(
        name="trainer",
        rows=rows,
        units={
            "tokens_per_s": "tokens/s",
            "step_time_s": "s",
            "peak_rss_mb": "MiB",
            "packing_efficiency": "fraction",
            "num_parameters_m": "M",
        },
        config={
            "dtype": "float32",
            "device": "cpu",
            "threads_per_rank": 1,
            "max_tokens_per_gpu": 1024,
            "batches": {name: m[1] for name, m in models.items()},
            "timed_steps": {name: m[2] for name, m in models.items()},
        },
        notes="SFT optimizer steps on generated variable-length samples; 2 ranks share 2 CPU cores",
    )
