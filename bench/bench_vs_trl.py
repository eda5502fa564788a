"""rollway against TRL (SFTTrainer, GRPOTrainer) on the same tiny model, data and batch.

    tiny Qwen3 (rollway make-tiny-model) + the demo's sft.parquet / rl.parquet
    for each repeat:  rollway SFT | TRL SFT | rollway GRPO | TRL GRPO      (interleaved A B A B)
    medians of the per-run medians -> bench/results/vs_trl.json

Workloads (issue #18): SFT, batch 64, lr 3e-3; GRPO, lr 1e-4, 16 prompts x 8 samples, at most 8 new
tokens, one optimizer step per rollout. rollway runs as a user runs it (`rollway run CONFIG`,
four local services); its figures come from the run's metrics.jsonl (perf/step_time, the
coordinator's wall time of a step, gRPC included). TRL runs in its own virtualenv (created here,
pinned, torch==2.13.0 first so that pip never pulls CUDA builds) with bench/trl_runner.py, which
times each optimizer step with a callback; fp32 without gradient checkpointing, like rollway on
CPU, at TRL's default thread count - or ROLLWAY_BENCH_TRL_THREADS (1: the trainer's own count;
on a machine busy with other work, two OpenMP threads that wait on each other were measured
~100x slower than one). The first steps of every run are warm-up and not counted.

- sft_tokens_per_s_ratio: rollway tokens/s / TRL tokens/s (goal >= 1.5)
- grpo_step_time_ratio: rollway s/step / TRL s/step (goal <= 0.5)
- process_s: whole process, start to exit (imports, model load, data, all steps)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.harness import BenchResult

TORCH_PIN = "torch==2.13.0"
TRL_PINS = ["trl==1.16.0", "transformers==5.23.0", TORCH_PIN]
TRL_VENV = Path(os.environ.get("ROLLWAY_TRL_VENV", Path.home() / ".cache" / "rollway-bench" / "trl-venv"))
RUNNER = Path(__file__).with_name("trl_runner.py")
WARMUP_STEPS = 3
TRL_THREADS = os.environ.get("ROLLWAY_BENCH_TRL_THREADS", "")  # "": TRL's default


def ensure_trl_venv() -> Path:
    """The TRL virtualenv's python, created on first use (torch first, then TRL with torch pinned)."""
    python = TRL_VENV / "bin" / "python"
    stamp = TRL_VENV / ".rollway-pins"
    if stamp.exists() and stamp.read_text() == " ".join(TRL_PINS):
        return python
    subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, TORCH_PIN], check=True)
    subprocess.run([*pip, *TRL_PINS], check=True)
    version = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not version.startswith(TORCH_PIN.split("==")[1]):
        raise RuntimeError(f"the TRL virtualenv got torch {version}, expected {TORCH_PIN}")
    stamp.write_text(" ".join(TRL_PINS))
    return python


def rollway_configs(
    workdir: Path, model: Path, data: Path, sft_steps: int, grpo_steps: int
) -> dict[str, Path]:
    """The demo's SFT and GRPO configs, without exports, evaluation or checkpoints."""
    from rollway.demo.addition import grpo_config, sft_config

    sft = sft_config(workdir, model, data, sft_steps, seed=0)
    grpo = grpo_config(workdir, model, data, grpo_steps, seed=0)
    # The optimizer schedule of trl_runner.py (the demo's own may differ): a constant lr.
    sft["lr"], grpo["lr"] = 3e-3, 1e-4
    for config in (sft, grpo):
        for key in ("save", "save_hf", "eval_prompt_data", "eval_interval"):
            config.pop(key, None)
        for key in ("lr_warmup_iters", "lr_decay_style", "lr_decay_iters"):
            config.pop(key, None)
        # Nothing about batching: the defaults (dynamic batch size, token budget) are what is measured.
        config.pop("use_dynamic_batch_size", None)
        config.pop("max_tokens_per_gpu", None)
    paths = {}
    for name, config in (("sft", sft), ("grpo", grpo)):
        paths[name] = workdir / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(config))
    return paths


def run_rollway(config: Path, run_id: str, workdir: Path, warmup_steps: int = WARMUP_STEPS) -> dict:
    """`rollway run CONFIG`: per-step figures from metrics.jsonl and the whole-process time."""
    started, started_epoch = time.perf_counter(), time.time()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rollway.cli",
            "run",
            str(config),
            "--run-id",
            run_id,
            "--run-dir",
            str(workdir),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    process_s = time.perf_counter() - started
    records = [json.loads(line) for line in (workdir / run_id / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "perf/step_time" in r]
    # Start-up: from `rollway run` to the end of the first step, less that step's own time.
    first_step_after_s = steps[0]["time"] - started_epoch - steps[0]["perf/step_time"]
    steps = steps[warmup_steps:]
    tokens = [r.get("sft/num_tokens", r.get("train/num_tokens", 0.0)) for r in steps]
    breakdown = {
        key: statistics.median(r.get(key, 0.0) for r in steps)
        for key in sorted({k for r in steps for k in r if k.startswith("perf/") and k.endswith("_time")})
    }
    return {
        "step_s": statistics.median(r["perf/step_time"] for r in steps),
        "tokens_per_step": statistics.median(tokens),
        "process_s": process_s,
        "first_step_after_s": first_step_after_s,
        "breakdown": breakdown,
    }


def run_trl(
    python: Path,
    workload: str,
    model: Path,
    data: Path,
    steps: int,
    workdir: Path,
    warmup_steps: int = WARMUP_STEPS,
    runner_args: tuple[str, ...] = (),
) -> dict:
    """One trl_runner.py run; `runner_args` are its batch flags (its defaults: this module's workload)."""
    out = workdir / f"trl-{workload}-{time.monotonic_ns()}.json"
    started = time.perf_counter()
    done = subprocess.run(
        [
            str(python),
            str(RUNNER),
            workload,
            "--model",
            str(model),
            "--data",
            str(data),
            "--steps",
            str(steps),
            "--out",
            str(out),
            "--workdir",
            str(workdir / f"trl-{workload}"),
            *runner_args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "TOKENIZERS_PARALLELISM": "false",
            **({"OMP_NUM_THREADS": TRL_THREADS} if TRL_THREADS else {}),
        },
    )
    if done.returncode != 0:  # TRL's own error, not only its exit status
        raise RuntimeError(f"trl_runner.py {workload} exited {done.returncode}:\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    return {
        "step_s": statistics.median(result["step_seconds"][warmup_steps:]),
        "process_s": time.perf_counter() - started,
        "first_step_after_s": result["first_step_after_s"],
        "num_threads": result["num_threads"],
        "peak_rss_bytes": result["peak_rss_bytes"],
    }


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def run(quick: bool) -> BenchResult:
    sft_steps, grpo_steps, repeats = (40, 12, 2) if quick else (200, 30, 3)
    python = ensure_trl_venv()
    from rollway.demo.data import make_demo_data
    from rollway.demo.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        workdir = Path(tmp)
        model = make_tiny_model(workdir / "tiny-model", seed=0)
        data = workdir / "data"
        make_demo_data(data, seed=0)
        configs = rollway_configs(workdir, model, data, sft_steps, grpo_steps)
        runs: dict[str, list[dict]] = {"rollway_sft": [], "trl_sft": [], "rollway_grpo": [], "trl_grpo": []}
        for repeat in range(repeats):  # interleaved, so that a busy spell hits both alike
            runs["rollway_sft"].append(run_rollway(configs["sft"], f"sft-{repeat}", workdir / "runs"))
            runs["trl_sft"].append(run_trl(python, "sft", model, data / "sft.parquet", sft_steps, workdir))
            runs["rollway_grpo"].append(run_rollway(configs["grpo"], f"grpo-{repeat}", workdir / "runs"))
            runs["trl_grpo"].append(run_trl(python, "grpo", model, data / "rl.parquet", grpo_steps, workdir))
    tokens_per_step = median_of(runs["rollway_sft"], "tokens_per_step")
    figures = {
        name: {k: median_of(r, k) for k in ("step_s", "process_s", "first_step_after_s")}
        for name, r in runs.items()
    }
    rollway_sft_tps = tokens_per_step / figures["rollway_sft"]["step_s"]
    trl_sft_tps = tokens_per_step / figures["trl_sft"]["step_s"]
    summary = {
        "sft_tokens_per_s_ratio": rollway_sft_tps / trl_sft_tps,
        "grpo_step_time_ratio": figures["rollway_grpo"]["step_s"] / figures["trl_grpo"]["step_s"],
        "sft_tokens_per_s": {"rollway": rollway_sft_tps, "trl": trl_sft_tps},
        "sft_step_s": {"rollway": figures["rollway_sft"]["step_s"], "trl": figures["trl_sft"]["step_s"]},
        "grpo_step_s": {"rollway": figures["rollway_grpo"]["step_s"], "trl": figures["trl_grpo"]["step_s"]},
        "process_s": {name: f["process_s"] for name, f in figures.items()},
        "first_step_after_s": {name: f["first_step_after_s"] for name, f in figures.items()},
        "rollway_breakdown_s": {
            "sft": runs["rollway_sft"][-1]["breakdown"],
            "grpo": runs["rollway_grpo"][-1]["breakdown"],
        },
        "trl_num_threads": runs["trl_sft"][-1]["num_threads"],
        "raw_runs": runs,
    }
    rows = [
        {
            "workload": workload,
            "rollway_step_s": figures[f"rollway_{workload}"]["step_s"],
            "trl_step_s": figures[f"trl_{workload}"]["step_s"],
            "ratio": summary["sft_tokens_per_s_ratio" if workload == "sft" else "grpo_step_time_ratio"],
            "rollway_process_s": figures[f"rollway_{workload}"]["process_s"],
            "trl_process_s": figures[f"trl_{workload}"]["process_s"],
        }
        for workload in ("sft", "grpo")
    ]
    return BenchResult(
        name="vs_trl",
        rows=rows,
        units={"rollway_step_s": "s", "trl_step_s": "s", "rollway_process_s": "s", "trl_process_s": "s"},
        config={
            "sft": {"batch": 64, "lr": 3e-3, "steps": sft_steps, "tokens_per_step": tokens_per_step},
            "grpo": {"prompts": 16, "samples_per_prompt": 8, "max_new_tokens": 8, "steps": grpo_steps},
            "repeats": repeats,
            "warmup_steps": WARMUP_STEPS,
            "trl": TRL_PINS,
        },
        summary=summary,
        notes="ratio: SFT tokens/s rollway/TRL (goal >= 1.5); GRPO s/step rollway/TRL (goal <= 0.5)",
    )
