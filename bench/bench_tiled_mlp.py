"""Long-sequence training step: peak memory and time with and without TiledMLP and with
gradient checkpointing (activation checkpointing of every decoder layer).

One packed 16k-token sample (quick: 3k) through the trainer's own engine (1 FSDP2 rank, fp32,
sft_loss, AdamW step) on a small Qwen3 whose MLP is wide (intermediate 8x hidden), so that the
[tokens, intermediate] MLP activations are the largest thing a step keeps. Each variant runs in
a fresh process: a warm-up step on a short sample, then the timed long step. Peak memory is the
process's peak RSS on CPU (the model, optimizer and all activations), or
torch.cuda.max_memory_allocated on a GPU.

    python -m bench.run tiled_mlp [--quick]
"""

from __future__ import annotations

import json
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

# One attention head keeps the O(tokens^2) attention cheap on a CPU; the MLP is 8x wide.
MODEL = {
    "hidden_size": 256,
    "intermediate_size": 2048,
    "num_hidden_layers": 2,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 32768,
}
THREADS = 1  # one thread per step: CPU time then measures the work, whatever else runs
VARIANTS = {
    "baseline": {},
    "tiled_mlp": {"tiled_mlp": True},
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "tiled_mlp+checkpointing": {"tiled_mlp": True, "gradient_checkpointing": True},
}


def _sample(length: int) -> list[SequenceItem]:
    generator = torch.Generator().manual_seed(length)
    tokens = torch.randint(3, 250, (length,), generator=generator).tolist()
    return [SequenceItem(0, tokens, 16, [1] * (length - 16))]


def _rank_main(rank: int, store_path: str, spec: dict, out_file: str) -> None:
    torch.set_num_threads(THREADS)
    info = init_process_group(dist.FileStore(store_path, 1), 0, 1, 600.0)
    try:
        config = from_dict(TrainerConfig, spec["config"])
        engine = TrainerEngine(config, info)
        engine.init(to_dict(config))
        warm, _ = plan_train_steps(_sample(512), config, 1)
        engine.train(warm[0])
        steps, _ = plan_train_steps(_sample(spec["tokens"]), config, 1)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started, cpu_started = time.perf_counter(), time.process_time()
        metrics = engine.train(steps[0])[0]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        if torch.cuda.is_available():
            peak_mb = torch.cuda.max_memory_allocated() / 2**20
        else:
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        row = {
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "peak_mb": peak_mb,
            "loss": metrics["train/loss"],
        }
        Path(out_file).write_text(json.dumps(row))
    finally:
        dist.destroy_process_group()


def run_variant(model_dir: Path, tokens: int, overrides: dict) -> dict:
    """One fresh process: its peak memory is this variant's alone."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = {
            "config": {
                "hf_checkpoint": str(model_dir),
                "dtype": "auto",
                "loss_type": "sft_loss",
                "max_tokens_per_gpu": tokens,
                "pad_to_multiple": 128,
                "lr": 1e-4,
                **overrides,
            },
            "tokens": tokens,
        }
        out_file = Path(tmp, "row.json")
        mp.start_processes(
            _rank_main,
            args=(str(Path(tmp, f"store-{uuid.uuid4().hex}")), spec, str(out_file)),
            nprocs=1,
            start_method="spawn",
            join=True,
        )
        return json.loads(out_file.read_text())


def run(quick: bool) -> BenchResult:
    tokens = 3072 if quick else 16384
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp, "model"), seed=0, **MODEL)
        for name, overrides in VARIANTS.items():
            rows.append({"variant": name, "tokens": tokens, **run_variant(model_dir, tokens, overrides)})
    base = rows[0]
    for row in rows:
        row["peak_vs_baseline"] = row["peak_mb"] / base["peak_mb"]
        row["cpu_time_vs_baseline"] = row["cpu_seconds"] / base["cpu_seconds"]
    return BenchResult(
        name="tiled_mlp",
        rows=rows,
        units={
            "cpu_seconds": "s",
            "seconds": "s",
            "peak_mb": "MiB",
            "tokens": "tokens",
            "peak_vs_baseline": "x",
            "cpu_time_vs_baseline": "x",
        },
        config={
            "model": MODEL,
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "dtype": "auto (fp32 on CPU, bf16 on CUDA)",
            "tiled_mlp_shards": "automatic: ceil(tokens / max(hidden_size, 1024))",
            "threads": THREADS,
        },
        notes="one packed long sample, sft_loss, one optimizer step after a short warm-up, 1 thread; "
        "cpu_seconds is the process's CPU time (steadier than wall time on a shared machine); "
        "peak = peak RSS on CPU",
    )
