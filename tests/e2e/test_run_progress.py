"""Honest progress through a checkpoint every step and a recovery: `rollway run` on the tiny model
with its trainer killed (kill -9, by pid) mid-run prints a line for every step, the recovery
(what died, how long it took, the step the run resumes at), a time per step that is the run's wall
time with its saves, and metrics.jsonl holds each weight sync's bytes and bandwidth."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from safetensors import safe_open

from rollway.demo.data import write_digit_share_reward
from rollway.deploy.chaos import Kill, run_with_chaos

pytestmark = pytest.mark.slow

NUM_STEPS = 6
ELEMENT_BYTES = {"F32": 4, "BF16": 2, "F16": 2}


def parameter_bytes(model_dir: Path) -> int:
    """The bytes of the model's stored tensors (a tied embedding is stored, and synced, once)."""
    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensor = f.get_slice(name)
                total += ELEMENT_BYTES[tensor.get_dtype()] * _numel(tensor.get_shape())
    return total


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def test_progress_has_every_step_the_recovery_and_the_real_pace(tmp_path, tiny_model_dir, demo_data_dir):
    write_digit_share_reward(tmp_path, "progress_reward")
    run_dir = tmp_path / "runs" / "progress"
    config = {
        "hf_checkpoint": str(tiny_model_dir),
        "prompt_data": [str(demo_data_dir / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "global_batch_size": 16,
        "num_rollout": NUM_STEPS,
        "rollout_max_response_len": 6,
        "dtype": "float32",
        "reward": "custom",
        "custom_rm_path": "progress_reward:digit_share",
        "save": str(tmp_path / "save"),
        "save_interval": 1,  # a checkpoint every step: the pace must include it
        "run_dir": str(tmp_path / "runs"),
        "run_id": "progress",
        "max_restarts": 2,
        "restart_backoff_seconds": 0.1,
    }
    config_path = tmp_path / "run.json"
    config_path.write_text(json.dumps(config))
    log_path = tmp_path / "launcher.log"
    run = run_with_chaos(
        config_path,
        run_dir,
        [Kill(2, "trainer")],
        seed=5,
        log_path=log_path,
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))},
        timeout_seconds=240.0,
    )
    console = log_path.read_text()
    assert run.returncode == 0 and run.error is None, console[-3000:]
    assert [kill.service for kill in run.kills] == ["trainer"] and run.kills[0].next_step_seconds, run.kills

    # The start, told as it happens: the services started, the model they load with its size
    # (from config.json: the parameters stored, fp32) and the time each took.
    expected_bytes = parameter_bytes(tiny_model_dir)
    assert re.search(r"^starting dataloader, rollout, trainer \.\.\.$", console, re.MULTILINE), console
    assert re.search(r"^services up in \d+\.\ds$", console, re.MULTILINE), console
    loading = re.search(rf"^loading {re.escape(str(tiny_model_dir))} in trainer, rollout_0 "
                        r"\(([\d.]+)M parameters, ([\d.]+) MB float32\) \.\.\.$", console, re.MULTILINE)  # fmt: skip
    assert loading, console
    assert float(loading[1]) == round(expected_bytes / 4 / 1e6, 1)
    assert float(loading[2]) == round(expected_bytes / 1e6, 1)
    # Once at the start and once after the recovery (the services are initialised afresh).
    initialised = re.findall(r"^services initialised in \d+\.\ds \((.*)\)$", console, re.MULTILINE)
    assert len(initialised) == 2 and all("trainer" in line for line in initialised), console

    # A line for every step, also those after the recovery.
    shown = {int(m) for m in re.findall(rf"^step (\d+)/{NUM_STEPS} \|", console, re.MULTILINE)}
    assert shown == set(range(1, NUM_STEPS + 1)), console
    # The recovery: what died, how long its restart took, where the run goes on and when.
    assert re.search(r"^recovered: trainer \(pid \d+.*restarted in \d+\.\ds", console, re.MULTILINE), console
    resumed = re.search(rf"^resuming at step (\d+)/{NUM_STEPS} from checkpoint rollout_(\d+), (\d+\.\d)s after",
                        console, re.MULTILINE)  # fmt: skip
    assert resumed, console
    # Saves every step: the step it resumes at is the one after the newest checkpoint.
    assert int(resumed[1]) == int(resumed[2]) + 1 and int(resumed[1]) >= 3, resumed[0]

    # The last line's time per step is the wall time between the first and last step's records
    # (saves and the recovery included), not perf/step_time. Both come from the same record times,
    # so they differ by the line's rounding (2 decimals) only.
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] < NUM_STEPS]
    assert [r["step"] for r in steps] == list(range(NUM_STEPS))
    wall_per_step = (steps[-1]["time"] - steps[0]["time"]) / (NUM_STEPS - 1)
    last_line = re.findall(rf"^step {NUM_STEPS}/{NUM_STEPS} \|.*\| ([\d.]+) s/step \|", console, re.MULTILINE)
    assert last_line and abs(float(last_line[-1]) - wall_per_step) <= 0.006, (last_line, wall_per_step)
    step_and_save = sum(r["perf/step_time"] + r["perf/save_time"] for r in steps) / NUM_STEPS
    assert wall_per_step >= step_and_save, (wall_per_step, step_and_save)  # the saves are in it
    assert all(r["perf/save_time"] > 0 for r in steps)

    # Each step's weight sync: its bytes are the model's (fp32 served) and a bandwidth.
    assert all(r["perf/weight_sync_bytes"] == expected_bytes for r in steps), (
        [r.get("perf/weight_sync_bytes") for r in steps],
        expected_bytes,
    )
    assert all(r["perf/weight_sync_gbytes_per_s"] > 0 for r in steps)
