"""Self-healing runs: a seeded harness kill -9s every service, mid background checkpoint writes (or
freezes the trainer, rollout and dataloader with SIGSTOP) during a short GRPO run under `rollway
run`; the run completes on its own, every prompt is used once, metrics.jsonl holds each step once,
and the final weights equal an uninterrupted run's bit for bit."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from support.small_disk import MIB, small_disk

from rollway.coordinator.prompt_ledger import PromptLedger
from rollway.demo.data import write_digit_share_reward
from rollway.deploy.chaos import FillDisk, Kill, run_with_chaos

pytestmark = pytest.mark.slow

NUM_STEPS = 10
RUN_SECONDS = 420.0
HUNG_SERVICE_SECONDS = 8.0  # the frozen-service run's bound (a toy step takes well under a second)


def write_config(
    path: Path, model: Path, data: Path, run_dir: Path, save: Path, export: Path, **overrides
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
        "num_rollout": NUM_STEPS,
        "rollout_max_response_len": 6,
        "lr": 3e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        "reward": "custom",
        "custom_rm_path": "chaos_reward:digit_share",
        "save": str(save),
        "save_interval": 1,
        "save_hf": str(export),
        "run_dir": str(run_dir),
        "run_id": "chaos",
        "max_restarts": 8,
        "restart_backoff_seconds": 0.1,
        **overrides,
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def run_to_end(tmp_path: Path, name: str, model: Path, data: Path, schedule=(), seed: int = 0, **overrides):
    workdir = tmp_path / name
    workdir.mkdir()
    write_digit_share_reward(workdir, "chaos_reward")
    run_dir = workdir / "runs"
    save = overrides.pop("save", workdir / "save")
    config = write_config(workdir / "run.json", model, data, run_dir, save, workdir / "hf", **overrides)
    pythonpath = f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    run = run_with_chaos(
        config,
        run_dir / "chaos",
        list(schedule),
        seed,
        log_path=workdir / "launcher.log",
        env={"PYTHONPATH": pythonpath},
        timeout_seconds=RUN_SECONDS,
    )
    return run, run_dir / "chaos", workdir


@pytest.fixture(scope="module")
def straight_dir(tmp_path_factory, tiny_model_dir, demo_data_dir) -> Path:
    """The uninterrupted run every faulty one is compared with."""
    tmp_path = tmp_path_factory.mktemp("straight")
    straight_run, run_dir, workdir = run_to_end(tmp_path, "straight", tiny_model_dir, demo_data_dir)
    assert straight_run.returncode == 0, (workdir / "launcher.log").read_text()[-3000:]
    return run_dir


def test_a_run_survives_kill_9_of_every_service_even_mid_checkpoint_with_nothing_lost_or_repeated(
    tmp_path, tiny_model_dir, demo_data_dir, straight_dir
):
    """kill -9 of the trainer, a rollout, the dataloader and the coordinator, one after another,
    in a run with async_save and a save every step: each kill lands just after a step, while that
    step's checkpoint is being written in the background (or just after). The trainer's kill loses
    its write; the coordinator's kill abandons the completion; every recovery resumes from the
    newest complete checkpoint and the run ends as the uninterrupted (blocking-save) run did."""
    schedule = [Kill(1, "trainer"), Kill(3, "rollout"), Kill(5, "dataloader"), Kill(7, "coordinator")]
    run, chaos_dir, chaos = run_to_end(
        tmp_path, "chaos", tiny_model_dir, demo_data_dir, schedule, seed=1234, async_save=True
    )
    log = (chaos / "launcher.log").read_text()
    assert run.returncode == 0, log[-3000:]
    assert run.error is None, run.error
    assert [kill.service for kill in run.kills] == ["trainer", "rollout", "dataloader", "coordinator"]
    # Each kill was followed by a replacement process and by a step the run logged.
    assert all(kill.replaced_seconds is not None for kill in run.kills), run.kills
    assert all(kill.next_step_seconds is not None for kill in run.kills), run.kills
    assert "restarting the coordinator (1/8)" in log
    assert json.loads((chaos_dir / "result.json").read_text())["num_coordinator_restarts"] == 1
    saves = [json.loads(line) for line in (chaos_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("perf/save_write_time" in r for r in saves)  # the writes were in the background
    assert_same_run(chaos_dir, straight_dir)


def test_a_run_survives_frozen_services_and_a_full_disk(
    tmp_path, tiny_model_dir, demo_data_dir, straight_dir
):
    """SIGSTOP of the trainer, a rollout and the dataloader: each is found hung (it answers
    nothing) after hung_service_seconds, killed and replaced. Then the checkpoints' disk fills up
    (a real ENOSPC: a small tmpfs) for two steps: with on_checkpoint_error continue the run trains
    on and saves again once there is room. The run ends as if nothing happened."""
    with small_disk(tmp_path / "disk", 256 * MIB) as disk:  # ten tiny-model checkpoints fit
        schedule = [Kill(1, "trainer", signal.SIGSTOP), Kill(3, "rollout", signal.SIGSTOP),
                    Kill(5, "dataloader", signal.SIGSTOP), FillDisk(7, disk)]  # fmt: skip
        run, frozen_dir, frozen = run_to_end(
            tmp_path, "frozen", tiny_model_dir, demo_data_dir, schedule, seed=99,
            hung_service_seconds=HUNG_SERVICE_SECONDS, save=str(disk / "save"), on_checkpoint_error="continue",
        )  # fmt: skip
        saved = sorted(p.name for p in (disk / "save").glob("rollout_*") if (p / "coordinator.json").exists())
    log = (frozen / "launcher.log").read_text()
    assert run.returncode == 0, log[-3000:]
    assert run.error is None, run.error
    assert [kill.service for kill in run.kills] == ["trainer", "rollout", "dataloader", "disk"]
    for kill in run.kills[:3]:
        # Found hung once silent for the bound (probes every 0.5 s), then replaced: the bound plus
        # a restart, never the minutes of a keepalive or call deadline.
        assert HUNG_SERVICE_SECONDS <= kill.replaced_seconds < HUNG_SERVICE_SECONDS + 30, run.kills
        assert kill.next_step_seconds is not None, run.kills
    # The console names each hang and recovery, and keeps printing progress after them.
    for service in ("trainer", "rollout", "dataloader"):
        assert re.search(rf"recovered: {service} \(pid \d+, at [^)]+\) is hung: it answered nothing", log), (
            log
        )
    assert re.search(rf"step {NUM_STEPS}/{NUM_STEPS} \|", log), log
    assert json.loads((frozen_dir / "status.json").read_text())["state"] == "SUCCEEDED"
    result = json.loads((frozen_dir / "result.json").read_text())
    assert [r["service"] for r in result["recoveries"]] == ["trainer", "rollout", "dataloader"]
    # The full disk cost the saves of the steps it lasted, not the run; the last one was written.
    full = run.kills[3]
    assert full.next_step_seconds is not None, run.kills
    assert 0 < len(saved) < NUM_STEPS and saved[-1] == f"rollout_{NUM_STEPS:07d}", saved
    assert_same_run(frozen_dir, straight_dir)


def assert_same_run(chaos_dir: Path, straight_dir: Path) -> None:
    """Each step once with the uninterrupted run's values, every prompt once in its order, and
    the final weights bit for bit."""
    # Each step once in metrics.jsonl, with the uninterrupted run's values.
    records = [json.loads(line) for line in (chaos_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "train/grad_norm" in r]
    assert steps == list(range(NUM_STEPS))
    straight_records = [
        json.loads(line) for line in (straight_dir / "metrics.jsonl").read_text().splitlines()
    ]
    for key in ("rollout/raw_reward", "train/pg_loss", "train/grad_norm"):
        assert [r[key] for r in records if key in r] == [r[key] for r in straight_records if key in r], key
    assert any(r.get("fault/num_restarts", 0) >= 1 for r in records)  # recoveries are counted

    # Every prompt once, in the uninterrupted run's order.
    used = PromptLedger.by_step(chaos_dir)
    assert sorted(used) == list(range(NUM_STEPS))
    positions = [p for step in sorted(used) for p in used[step]]
    assert len(positions) == len(set(positions)) == NUM_STEPS * 4
    assert used == PromptLedger.by_step(straight_dir)

    # The final weights, bit for bit.
    exports = [
        Path(json.loads((d / "result.json").read_text())["hf_export_dir"]) for d in (chaos_dir, straight_dir)
    ]
    assert exports[0] != exports[1]
    assert (exports[0] / "model.safetensors").read_bytes() == (exports[1] / "model.safetensors").read_bytes()
