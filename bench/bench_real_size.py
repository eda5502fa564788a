"""Real size: SFT and GRPO on a ~0.3B Qwen3-shaped model under `rollway run`, with a checkpoint and
a kill -9 of the trainer in each run (issue #26).

What runs: `rollway run CONFIG` as a real process (rollway.deploy.chaos.run_with_chaos), once for
SFT and once for GRPO (32 new tokens), each saving a checkpoint every few steps (FULL, QUICK);
once a few steps are logged the trainer (rank 0, by pid) gets kill -9 and the run recovers on
its own. The model is the 12-layer cut of Qwen3-0.6B's shape (344M parameters, the real 151,936
vocabulary, tied embeddings, fp32) with the project's own tokenizer, built once under
.cache/bench-real-size/ (random weights: speed and memory do not depend on them).

Rows: one per run (sft, grpo):
    s_per_step            mean (perf/step_time + perf/save_time) over the run's steps: what a
                          step costs the run, checkpoint included
    step_s, save_s        mean perf/step_time; mean perf/save_time of the steps that saved
    tokens_per_s          trained tokens / (step + save seconds), over the run
    train_tokens_per_s    trained tokens / perf/train_time (the trainer's share only)
    grad_norm             mean gradient norm: the steps trained (GRPO's reward varies, so > 0)
    checkpoint_bytes      checkpoint/bytes of the last save (one run checkpoint on disk)
    sync_bytes, sync_gb_s weight-sync bytes per push and GB/s (GRPO): the metrics when the run
                          logs weight_sync bytes, else the trainer's "weights pushed" log lines
    peak_<service>_gib    VmHWM of the service's processes (the trainer's ranks summed), the
                          largest of its incarnations (bench/service_memory.py)
    startup_s             launch -> first step record (services start, models load)
    kill_to_next_step_s   kill -9 of the trainer -> the run logs a step it had not before
    wall_s                launch -> `rollway run` exits

--quick: the same on the "small" preset (~50.6M parameters, 400-token vocabulary), 2 steps each
(the kill after the first, so the second is the step after the recovery): about a minute on the
shared 2-core machine (two launches and two recoveries dominate).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import BenchResult
from bench.service_memory import ServiceMemory
from rollway.deploy.chaos import Kill, run_with_chaos

REPO = Path(__file__).resolve().parents[1]
MODEL_CACHE = REPO / ".cache" / "bench-real-size"
GIB = 1 << 30

# Qwen3-0.6B (hidden 1024, 16/8 heads of 128, intermediate 3072, vocabulary 151,936, tied) cut to
# 12 of its 28 layers: 344M parameters, 1.38 GB in fp32.
QWEN3_06B_12_LAYERS = dict(
    hidden_size=1024,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151_936,
    max_position_embeddings=4096,
)
SHAPES = {"qwen3-0.6b-12-layers": QWEN3_06B_12_LAYERS, "small": {}}


@dataclass(frozen=True)
class Schedule:
    """How long each run is, when it saves and when its trainer is killed."""

    num_steps: int
    save_interval: int  # a checkpoint exists before the kill: recovery resumes from it
    kill_after_step: int  # the trainer dies once this many steps are logged (mid-step or mid-save)


FULL = Schedule(num_steps=6, save_interval=2, kill_after_step=3)
QUICK = Schedule(num_steps=2, save_interval=1, kill_after_step=1)
MAX_NEW_TOKENS = 32
SAVE_TOTAL_LIMIT = 2  # rotation keeps the disk to two run checkpoints (4.5 GB each at full size)
RUN_TIMEOUT_SECONDS = 1200.0
SYNC_BYTES = "perf/weight_sync_bytes"  # per push; GB/s over the run is computed here


# A reward that varies between a random model's samples, so GRPO's advantages (and gradients) are
# not all zero. The demo's digit_share would score 0 everywhere here: with 151,936 logits and a
# 400-token tokenizer nearly every sampled id is a padded row that decodes to nothing.
EVEN_TOKEN_SHARE_REWARD = """
def even_token_share(sample):
    ids = sample.response_token_ids
    return sum(i % 2 == 0 for i in ids) / max(len(ids), 1)
"""


def model_dir(shape: str) -> Path:
    """The model of `shape` under .cache, built on first use (a marker written last: a build cut
    short is rebuilt)."""
    from rollway.demo.tiny_model import make_tiny_model

    out = MODEL_CACHE / shape
    marker = out / ".complete"
    if not marker.exists():
        make_tiny_model(out, seed=0, preset="small", **SHAPES[shape])
        marker.write_text("built by bench/bench_real_size.py\n")
    return out


def parameter_count(model: Path) -> int:
    """Distinct parameters, from the safetensors header (tied embeddings are stored once)."""
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), framework="pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def run_config(kind: str, workdir: Path, model: Path, data: Path, schedule: Schedule) -> dict:
    common = {
        "hf_checkpoint": str(model),
        "run_dir": str(workdir / "runs"),
        "run_id": kind,
        "apply_chat_template": True,
        "num_rollout": schedule.num_steps,
        "lr": 1e-5,
        "use_dynamic_batch_size": True,
        # Above a step's tokens (SFT ~180, GRPO ~370), and what the memory plan lets through: at 4096
        # it predicts 11 GiB of activations for the 344M shape and `rollway run` refuses the run.
        "max_tokens_per_gpu": 1024,
        "save": str(workdir / "save"),
        "save_interval": schedule.save_interval,
        "save_total_limit": SAVE_TOTAL_LIMIT,
        "max_restarts": 3,
        "restart_backoff_seconds": 0.1,
        "seed": 0,
    }
    if kind == "sft":
        return {
            **common,
            "loss_type": "sft_loss",
            "prompt_data": [str(data / "sft.parquet")],
            "input_key": "messages",
            "rollout_batch_size": 8,
            "global_batch_size": 8,
        }
    return {
        **common,
        "loss_type": "policy_loss",
        "advantage_estimator": "grpo",
        "prompt_data": [str(data / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 4,
        "global_batch_size": 8,
        "rollout_max_response_len": MAX_NEW_TOKENS,
        "rollout_temperature": 1.0,
        "reward": "custom",
        "custom_rm_path": "bench_reward:even_token_share",
    }


def step_records(run_dir: Path) -> list[dict]:
    """One record per step (a step redone after a recovery: its last record), in step order."""
    by_step: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "perf/step_time" in record:
            by_step[record["step"]] = record
    return [by_step[step] for step in sorted(by_step)]


def trained_tokens(records: list[dict]) -> list[float]:
    """Tokens the trainer trained on at each step (prompt and response; SFT logs them as sft/*)."""
    return [r.get("train/num_tokens", r.get("sft/num_tokens", 0.0)) for r in records]


def weight_sync(records: list[dict]) -> tuple[float, float]:
    """(bytes per push, GB/s over all pushes) from the run's perf/weight_sync_bytes and
    perf/weight_sync_time; (0, 0) when nothing was pushed (SFT)."""
    pushes = [(r[SYNC_BYTES], r["perf/weight_sync_time"]) for r in records if r.get(SYNC_BYTES)]
    if not pushes:
        return 0.0, 0.0
    num_bytes = max(b for b, _ in pushes)
    return num_bytes, sum(b for b, _ in pushes) / max(sum(s for _, s in pushes), 1e-9) / 1e9


def keep_logs(workdir: Path, run_dir: Path, to: Path) -> Path:
    """Copy a failed run's launcher and service logs (not its checkpoints) out of the temporary
    directory, so that what failed can be read after the bench has cleaned up."""
    shutil.rmtree(to, ignore_errors=True)
    (to / "services").mkdir(parents=True)
    shutil.copy(workdir / "launcher.log", to)
    for log in (run_dir / "services").glob("*.log"):
        shutil.copy(log, to / "services")
    return to


def bench_one(kind: str, root: Path, model: Path, data: Path, schedule: Schedule) -> dict:
    workdir = root / kind
    workdir.mkdir()
    (workdir / "bench_reward.py").write_text(EVEN_TOKEN_SHARE_REWARD)
    config = workdir / "run.json"
    config.write_text(json.dumps(run_config(kind, workdir, model, data, schedule)))  # JSON is YAML
    run_dir = workdir / "runs" / kind
    launched = time.time()
    with ServiceMemory(os.getpid()) as memory:
        run = run_with_chaos(
            config,
            run_dir,
            [Kill(schedule.kill_after_step, "trainer")],
            seed=0,
            log_path=workdir / "launcher.log",
            env={"PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
            timeout_seconds=RUN_TIMEOUT_SECONDS,
        )
    if run.returncode != 0 or run.error or not run.kills or run.kills[0].next_step_seconds is None:
        kept = keep_logs(workdir, run_dir, MODEL_CACHE / "last-failure" / kind)
        tail = (workdir / "launcher.log").read_text()[-3000:]
        raise RuntimeError(
            f"the {kind} run: exit {run.returncode}, {run.error or 'no recovery'} (logs in {kept}): {tail}"
        )
    records = step_records(run_dir)
    if len(records) != schedule.num_steps:
        raise RuntimeError(
            f"the {kind} run logged steps {[r['step'] for r in records]}, not {schedule.num_steps}"
        )
    step_s = [r["perf/step_time"] for r in records]
    saves = [r["perf/save_time"] for r in records if "perf/save_time" in r]
    paid = sum(step_s) + sum(saves)
    tokens = trained_tokens(records)
    sync_bytes, sync_gb_s = weight_sync(records)
    peaks = memory.peak_bytes()
    return {
        "run": kind,
        "steps": len(records),
        "s_per_step": round(paid / len(records), 3),
        "step_s": round(sum(step_s) / len(step_s), 3),
        "save_s": round(sum(saves) / max(len(saves), 1), 3),
        "tokens_per_step": round(sum(tokens) / len(tokens), 1),
        "tokens_per_s": round(sum(tokens) / paid, 1),
        "train_tokens_per_s": round(sum(tokens) / sum(r["perf/train_time"] for r in records), 1),
        "grad_norm": round(
            sum(r.get("train/grad_norm", r.get("sft/grad_norm", 0.0)) for r in records) / len(records), 4
        ),
        "checkpoint_bytes": int(
            next(r["checkpoint/bytes"] for r in reversed(records) if "checkpoint/bytes" in r)
        ),
        "sync_bytes": int(sync_bytes),
        "sync_gb_s": round(sync_gb_s, 3),
        **{
            f"peak_{s}_gib": round(peaks.get(s, 0) / GIB, 2)
            for s in ("trainer", "rollout", "dataloader", "coordinator")
        },
        "startup_s": round(records[0]["time"] - launched - records[0]["perf/step_time"], 1),
        "kill_to_next_step_s": round(run.kills[0].next_step_seconds, 1),
        "wall_s": round(run.seconds, 1),
    }


def run(quick: bool) -> BenchResult:
    from rollway.demo.data import make_demo_data

    shape, schedule = ("small", QUICK) if quick else ("qwen3-0.6b-12-layers", FULL)
    model = model_dir(shape)
    with tempfile.TemporaryDirectory(prefix="bench-real-size-") as tmp:
        root = Path(tmp)
        make_demo_data(root / "data", seed=0, num_sft=200, num_rl=100, num_eval=0)
        rows = [bench_one(kind, root, model, root / "data", schedule) for kind in ("sft", "grpo")]
    num_parameters = parameter_count(model)
    return BenchResult(
        name="real_size",
        rows=rows,
        units={
            "s_per_step": "s",
            "step_s": "s",
            "save_s": "s",
            "tokens_per_s": "tokens/s",
            "train_tokens_per_s": "tokens/s",
            "checkpoint_bytes": "B",
            "sync_bytes": "B",
            "sync_gb_s": "GB/s",
            "startup_s": "s",
            "kill_to_next_step_s": "s",
            "wall_s": "s",
            **{f"peak_{s}_gib": "GiB" for s in ("trainer", "rollout", "dataloader", "coordinator")},
        },
        config={
            "shape": shape,
            "model": {
                k: v for k, v in json.loads((model / "config.json").read_text()).items() if k in _SHAPE_KEYS
            },
            "num_parameters": num_parameters,
            "dtype": "float32",
            "num_steps": schedule.num_steps,
            "save_interval": schedule.save_interval,
            "save_total_limit": SAVE_TOTAL_LIMIT,
            "kill": f"kill -9 trainer once {schedule.kill_after_step} steps are logged",
            "sft": "8 conversations a step",
            "grpo": f"2 prompts x 4 samples, {MAX_NEW_TOKENS} new tokens",
            "command": "python -m bench.run real_size" + (" --quick" if quick else ""),
        },
        summary={"num_parameters": num_parameters, "parameter_bytes_fp32": 4 * num_parameters},
        notes=f"{shape} ({num_parameters / 1e6:.0f}M parameters, fp32): SFT and GRPO under `rollway run`, "
        f"one kill -9 of the trainer each",
    )


_SHAPE_KEYS = (*QWEN3_06B_12_LAYERS, "tie_word_embeddings", "dtype")
