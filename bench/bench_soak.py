"""Soak: a long GRPO run under `rollway run` survives many kill -9s and freezes (SIGSTOP) with
nothing lost or repeated.

What runs: the tiny model's GRPO run (the chaos test's settings, more steps) twice with the same
seed, as real processes: once uninterrupted, once while rollway.deploy.chaos kill -9s a random
service (trainer, rollout, dataloader; the coordinator now and then) at seeded random moments,
or freezes one (SIGSTOP: the coordinator's hang watch must find it after hung_service_seconds and
kill it), one failure at a time (the next fault waits for the replacement and for a step logged
after it).

Rows: one per kill:
    service, fault, pid          what was killed (kill -9) or frozen (SIGSTOP); "disk": the
                                 checkpoints' disk filled (a tmpfs: ENOSPC) for two steps
    steps_logged                 when (distinct steps in metrics.jsonl)
    replaced_s                   kill -> a new process of that service runs
    next_step_s                  kill -> the run logs a step record it had not before (recovery)
    restart_s                    the coordinator's own restart_seconds for it (its "service
                                 restarted" log line: backoff excluded, start-up until SERVING);
                                 empty for a coordinator, which `rollway run` restarts
Summary:
    kills, kills_survived        survived: the run went on to log a step and completed (exit 0)
    prompts_lost / _duplicated   prompts.jsonl vs the uninterrupted run's (goal 0 / 0)
    steps_differing_prompts      steps whose prompts differ from the uninterrupted run's
    weights_bit_identical        the final HF exports' model.safetensors, byte for byte
    overhead_s                   chaos run wall time - uninterrupted run wall time (and per kill)
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from bench.harness import BenchResult
from rollway.coordinator.prompt_ledger import PromptLedger
from rollway.demo.data import write_digit_share_reward
from rollway.deploy.chaos import ChaosRun, FillDisk, NoSmallDisk, random_schedule, run_with_chaos, small_disk

SEED = 2024
RUN_ID = "soak"
CHECKPOINT_BYTES = 16 << 20  # a tiny-model run checkpoint takes ~12 MiB
FREEZE_SHARE = 0.3  # of the faults on the trainer, rollout and dataloader
HUNG_SERVICE_SECONDS = 8.0


def write_config(
    workdir: Path, model: Path, data: Path, num_steps: int, max_restarts: int, save: Path | None = None
) -> Path:
    config = {
        "hf_checkpoint": str(model),
        "prompt_data": [str(data / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "global_batch_size": 16,
        "num_rollout": num_steps,
        "rollout_max_response_len": 6,
        "lr": 3e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        "reward": "custom",
        "custom_rm_path": "soak_reward:digit_share",
        "save": str(save or workdir / "save"),
        "on_checkpoint_error": "continue",  # a full disk costs saves, not the run
        "save_interval": 1,
        "save_hf": str(workdir / "hf"),
        "run_dir": str(workdir / "runs"),
        "run_id": RUN_ID,
        "max_restarts": max_restarts,
        "restart_backoff_seconds": 0.1,
        "hung_service_seconds": HUNG_SERVICE_SECONDS,
    }
    path = workdir / "run.json"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def soak_run(
    root: Path, name: str, model: Path, data: Path, num_steps: int, schedule, save: Path | None = None
) -> tuple[ChaosRun, Path]:
    workdir = root / name
    workdir.mkdir()
    write_digit_share_reward(workdir, "soak_reward")
    config = write_config(workdir, model, data, num_steps, max_restarts=len(schedule) + 2, save=save)
    run_dir = workdir / "runs" / RUN_ID
    run = run_with_chaos(
        config,
        run_dir,
        schedule,
        SEED,
        log_path=workdir / "launcher.log",
        env={"PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
        timeout_seconds=900.0,
    )
    if run.returncode != 0:
        tail = (workdir / "launcher.log").read_text()[-3000:]
        raise RuntimeError(f"the {name} run exited with {run.returncode}: {tail}")
    return run, run_dir


def coordinator_restarts(run_dir: Path) -> list[dict]:
    """Every "service restarted" record of every coordinator of the run, in time order."""
    from datetime import datetime

    found = []
    for path in (run_dir / "services").glob("coordinator-*.log"):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "service restarted":
                when = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
                found.append({**record, "time": when})
    return sorted(found, key=lambda r: r["time"])


def kill_rows(run: ChaosRun, run_dir: Path) -> list[dict]:
    restarts = coordinator_restarts(run_dir)
    rows = []
    for number, kill in enumerate(run.kills, 1):
        restart = None
        if kill.service != "coordinator":  # its restart, logged after the kill by the coordinator
            restart = next(
                (r for r in restarts if r["service"] == kill.service and r["time"] > kill.killed_at), None
            )
            if restart is not None:
                restarts.remove(restart)
        rows.append(
            {
                "kill": number,
                "service": kill.service,
                "fault": {signal.SIGSTOP: "SIGSTOP", signal.SIGKILL: "kill -9"}.get(kill.signum, "full disk"),
                "pid": kill.pid,
                "steps_logged": kill.steps_logged,
                "delay_s": round(kill.delay_seconds, 3),
                "replaced_s": _round(kill.replaced_seconds),
                "next_step_s": _round(kill.next_step_seconds),
                "restart_s": _round(restart["restart_seconds"]) if restart else "",
            }
        )
    return rows


def prompt_figures(chaos_dir: Path, straight_dir: Path) -> dict:
    chaos, straight = PromptLedger.by_step(chaos_dir), PromptLedger.by_step(straight_dir)
    used = Counter(p for prompts in chaos.values() for p in prompts)
    expected = Counter(p for prompts in straight.values() for p in prompts)
    return {
        "prompts_expected": sum(expected.values()),
        "prompts_lost": sum((expected - used).values()),
        "prompts_duplicated": sum((used - expected).values()),
        "steps_differing_prompts": sum(chaos.get(s) != straight.get(s) for s in set(chaos) | set(straight)),
    }


def final_weights(run_dir: Path) -> bytes:
    export = Path(json.loads((run_dir / "result.json").read_text())["hf_export_dir"])
    return (export / "model.safetensors").read_bytes()


def steps_once(run_dir: Path, num_steps: int) -> bool:
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return steps == list(range(num_steps))


def run(quick: bool) -> BenchResult:
    from rollway.demo.data import make_demo_data
    from rollway.demo.tiny_model import make_tiny_model

    num_steps, num_kills = (12, 4) if quick else (36, 16)
    schedule = random_schedule(num_kills, num_steps, SEED, freeze_share=FREEZE_SHARE)
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        root = Path(tmp)
        model = make_tiny_model(root / "model", seed=0)
        data = root / "data"
        make_demo_data(data, seed=0)
        straight, straight_dir = soak_run(root, "straight", model, data, num_steps, [])
        with ExitStack() as stack:
            try:  # the checkpoints on a small disk that a fault fills (root only)
                disk = stack.enter_context(small_disk(root / "disk", num_steps * CHECKPOINT_BYTES * 2))
                schedule = with_full_disk(schedule, num_steps, disk)
                disk_fault = "filled for 2 steps"
            except NoSmallDisk as reason:
                disk, disk_fault = None, f"not filled: {reason}"
            chaos, chaos_dir = soak_run(
                root, "chaos", model, data, num_steps, schedule, save=disk / "save" if disk else None
            )
        rows = kill_rows(chaos, chaos_dir)
        recoveries = [k.next_step_seconds for k in chaos.kills if k.next_step_seconds is not None]
        summary = {
            "kills_scheduled": len(schedule),
            "kills": len(chaos.kills),
            "kills_survived": len(chaos.kills) if chaos.returncode == 0 else 0,  # the run completed
            "coordinator_kills": sum(k.service == "coordinator" for k in chaos.kills),
            "freezes": sum(k.signum == signal.SIGSTOP for k in chaos.kills),
            "disk": disk_fault,
            "freeze_recovery_max_s": round(
                max(
                    (k.next_step_seconds or 0.0 for k in chaos.kills if k.signum == signal.SIGSTOP),
                    default=0.0,
                ),
                2,
            ),
            **prompt_figures(chaos_dir, straight_dir),
            "each_step_once": steps_once(chaos_dir, num_steps),
            "weights_bit_identical": final_weights(chaos_dir) == final_weights(straight_dir),
            "straight_s": round(straight.seconds, 1),
            "chaos_s": round(chaos.seconds, 1),
            "overhead_s": round(chaos.seconds - straight.seconds, 1),
            "overhead_per_kill_s": round((chaos.seconds - straight.seconds) / max(len(chaos.kills), 1), 2),
            "recovery_mean_s": round(sum(recoveries) / max(len(recoveries), 1), 2),
            "recovery_max_s": round(max(recoveries, default=0.0), 2),
            "harness_error": chaos.error or "",
        }
    return BenchResult(
        name="soak",
        rows=rows,
        units={"delay_s": "s", "replaced_s": "s", "next_step_s": "s", "restart_s": "s"},
        config={
            "num_steps": num_steps,
            "seed": SEED,
            "model": "tiny",
            "restart_backoff_seconds": 0.1,
            "hung_service_seconds": HUNG_SERVICE_SECONDS,
        },
        summary=summary,
        notes=f"GRPO, {num_steps} steps, {len(chaos.kills)} kill -9s and freezes under `rollway run`",
    )


def with_full_disk(schedule: list, num_steps: int, disk: Path) -> list:
    """The schedule with the disk filled at the first step from the middle on that no kill uses."""
    taken = {kill.after_step for kill in schedule}
    step = next(s for s in range(num_steps // 2, num_steps - 3) if s not in taken)
    return sorted([*schedule, FillDisk(step, disk)], key=lambda fault: fault.after_step)


def _round(value: float | None):
    return round(value, 2) if value is not None else ""
