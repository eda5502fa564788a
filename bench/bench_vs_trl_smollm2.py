"""rollway against TRL (SFTTrainer, GRPOTrainer) on a real model: SmolLM2-135M-Instruct (issue #37).

    .cache/smollm2 (make real-model) + rollway.demo.smollm2's addition data
    for each repeat:  rollway SFT | TRL SFT | rollway GRPO | TRL GRPO      (interleaved A B A B)
    medians of the per-run medians, peak memory -> bench/results/vs_trl_smollm2.json

The work is the settings that train this model (rollway.demo.smollm2, tests/realmodel): GRPO on
"What is A + B? Answer with just the number.", 8 prompts x 8 samples, at most 32 new tokens, lr
2e-5, one optimizer step per rollout, reward = the response's last number against the sum; SFT on
the demo's 400 conversations, 16 a step, lr 1e-5. The TRL runner's flags are derived from the
rollway config (`trl_runner_args`), so both sides get the same batch, lengths, lr and reward by
construction. How each side is run and timed is bench_vs_trl.py's (rollway: `rollway run`,
perf/step_time from metrics.jsonl; TRL: its own pinned virtualenv, a step-timing callback; fp32,
no gradient checkpointing; ROLLWAY_BENCH_TRL_THREADS as there). A step of this model takes
seconds, not milliseconds, so one warm-up step per run is enough and few steps are counted.

- sft_tokens_per_s_ratio: rollway tokens/s / TRL tokens/s (the same tokens: rollway's count a step)
- grpo_step_time_ratio: rollway s/step / TRL s/step
- peak memory: rollway's services' peak RSS (VmHWM) summed, against the TRL process's
The model directory is ROLLWAY_REAL_MODEL_DIR, else the repository's .cache/smollm2.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import yaml

from bench.bench_vs_trl import TRL_PINS, ensure_trl_venv, run_rollway, run_trl
from bench.harness import BenchResult

REPO = Path(__file__).resolve().parents[1]
WARMUP_STEPS = 1
GIB = 2**30
SFT_BATCH = 16  # tests/realmodel's SFT run


def real_model_dir() -> Path:
    directory = Path(os.environ.get("ROLLWAY_REAL_MODEL_DIR") or REPO / ".cache" / "smollm2")
    if not (directory / "config.json").is_file():
        raise RuntimeError(
            f"no converted SmolLM2 at {directory}: `make real-model` (or ROLLWAY_REAL_MODEL_DIR)"
        )
    return directory


def smollm2_configs(model: Path, data: Path, sft_steps: int, grpo_steps: int) -> dict[str, dict]:
    """rollway's SFT and GRPO run configs for the bench: the demo's GRPO and the real-model
    tests' SFT, without evaluation, checkpoints or exports (run id and run dir come from the CLI)."""
    from rollway.demo.smollm2 import SFT_LR, grpo_config

    grpo = grpo_config(Path("unused"), model, data, grpo_steps, seed=0)
    for key in ("run_id", "run_dir", "eval_prompt_data", "eval_interval"):
        grpo.pop(key)
    sft = {
        "hf_checkpoint": str(model),
        "loss_type": "sft_loss",
        "prompt_data": [str(data / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "num_rollout": sft_steps,
        "rollout_batch_size": SFT_BATCH,
        "global_batch_size": SFT_BATCH,
        "lr": SFT_LR,
        "seed": 0,
        # The token budget that fits this model (grpo_config's); one micro-batch holds the step.
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": grpo["max_tokens_per_gpu"],
    }
    return {"sft": sft, "grpo": grpo}


def trl_runner_args(workload: str, config: dict) -> tuple[str, ...]:
    """trl_runner.py's batch flags for the same work as the rollway `config`."""
    if config.get("lr_decay_style", "constant") != "constant" or config.get("lr_warmup_iters"):
        raise ValueError("trl_runner.py runs a constant lr; the config decays it")
    args = ["--batch-size", str(config["global_batch_size"]), "--lr", repr(config["lr"])]
    if workload == "sft":
        return tuple(args)
    if config["global_batch_size"] != config["rollout_batch_size"] * config["n_samples_per_prompt"]:
        raise ValueError("the bench compares one optimizer step per rollout")
    if config["rm_type"] != "exact_match" or config["rollout_temperature"] != 1.0:
        raise ValueError("trl_runner.py's GRPO has exact_match's last-number reward at temperature 1")
    return (
        *args,
        "--num-generations",
        str(config["n_samples_per_prompt"]),
        "--max-completion-length",
        str(config["rollout_max_response_len"]),
        "--reward",
        "last-number",
    )


def run_rollway_measured(config: Path, run_id: str, workdir: Path) -> dict:
    """run_rollway and the peak RSS of each service of the run (summed: what the run needs)."""
    from bench.service_memory import ServiceMemory

    with ServiceMemory(os.getpid()) as memory:
        figures = run_rollway(config, run_id, workdir, warmup_steps=WARMUP_STEPS)
    peaks = memory.peak_bytes()
    return {**figures, "peak_rss_bytes": sum(peaks.values()), "service_peak_rss_bytes": peaks}


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def run(quick: bool) -> BenchResult:
    # Counted steps (WARMUP_STEPS more run first); ~15 minutes on 2 cores (TRL's GRPO step is ~50 s).
    sft_counted, grpo_counted, repeats = (2, 1, 1) if quick else (5, 5, 2)
    sft_steps, grpo_steps = sft_counted + WARMUP_STEPS, grpo_counted + WARMUP_STEPS
    model = real_model_dir()
    python = ensure_trl_venv()
    from rollway.demo.smollm2 import make_data

    with tempfile.TemporaryDirectory(prefix="vs-trl-smollm2-") as tmp:
        workdir = Path(tmp)
        data = make_data(workdir / "data", seed=0)
        configs = smollm2_configs(model, data, sft_steps, grpo_steps)
        paths = {}
        for name, config in configs.items():
            paths[name] = workdir / f"{name}.yaml"
            paths[name].write_text(yaml.safe_dump(config))
        runs: dict[str, list[dict]] = {"rollway_sft": [], "trl_sft": [], "rollway_grpo": [], "trl_grpo": []}

        parquet = {"sft": data / "sft.parquet", "grpo": data / "rl.parquet"}
        steps = {"sft": sft_steps, "grpo": grpo_steps}

        def measure(name: str, repeat: int) -> dict:
            workload = name.split("_")[1]
            if name.startswith("rollway"):
                return run_rollway_measured(paths[workload], f"{workload}-{repeat}", workdir / "runs")
            runner_args = trl_runner_args(workload, configs[workload])
            return run_trl(
                python,
                workload,
                model,
                parquet[workload],
                steps[workload],
                workdir,
                WARMUP_STEPS,
                runner_args,
            )

        for repeat in range(repeats):  # interleaved, so that a busy spell hits both alike
            for name in runs:
                runs[name].append(measure(name, repeat))
                shown = {k: v for k, v in runs[name][-1].items() if k.endswith("_s") or k == "peak_rss_bytes"}
                print(f"repeat {repeat} {name}: {shown}", flush=True)  # a long bench shows its progress
    return summarise(runs, configs, sft_steps, grpo_steps, repeats)


def summarise(runs: dict[str, list[dict]], configs: dict, sft_steps: int, grpo_steps: int, repeats: int):
    tokens_per_step = median_of(runs["rollway_sft"], "tokens_per_step")
    figures = {
        name: {k: median_of(r, k) for k in ("step_s", "process_s", "first_step_after_s")}
        | {"peak_gib": max(run["peak_rss_bytes"] for run in r) / GIB}
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
        "peak_gib": {name: f["peak_gib"] for name, f in figures.items()},
        "rollway_service_peak_gib": {
            workload: {
                service: max(
                    run["service_peak_rss_bytes"].get(service, 0) for run in runs[f"rollway_{workload}"]
                )
                / GIB
                for service in runs[f"rollway_{workload}"][-1]["service_peak_rss_bytes"]
            }
            for workload in ("sft", "grpo")
        },
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
            "rollway_peak_gib": figures[f"rollway_{workload}"]["peak_gib"],
            "trl_peak_gib": figures[f"trl_{workload}"]["peak_gib"],
        }
        for workload in ("sft", "grpo")
    ]
    sft, grpo = configs["sft"], configs["grpo"]
    return BenchResult(
        name="vs_trl_smollm2",
        rows=rows,
        units={"rollway_step_s": "s", "trl_step_s": "s", "rollway_peak_gib": "GiB", "trl_peak_gib": "GiB"},
        config={
            "model": "SmolLM2-135M-Instruct (fp32)",
            "sft": {
                "batch": sft["global_batch_size"],
                "lr": sft["lr"],
                "steps": sft_steps,
                "tokens_per_step": tokens_per_step,
            },
            "grpo": {
                "prompts": grpo["rollout_batch_size"],
                "samples_per_prompt": grpo["n_samples_per_prompt"],
                "max_new_tokens": grpo["rollout_max_response_len"],
                "lr": grpo["lr"],
                "steps": grpo_steps,
            },
            "repeats": repeats,
            "warmup_steps": WARMUP_STEPS,
            "trl": TRL_PINS,
        },
        summary=summary,
        notes="ratio: SFT tokens/s rollway/TRL; GRPO s/step rollway/TRL; peak: rollway's services summed",
    )
