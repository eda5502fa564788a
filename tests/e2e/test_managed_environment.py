"""An Environment service the coordinator starts for a run (remote_environment): the rollout
services get its address, it is killed -9 mid-run, the coordinator restarts it (a new process on
the same port) while the run goes on without a checkpoint to go back to, the run finishes every
step, and the environment is stopped with the run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.processes import ServiceProcess, wait_all_gone
from support.run_environment import run_killing_its_environment, trained_steps

from rollway.coordinator.dashboard.run_files import read_notices
from rollway.coordinator.v1 import coordinator_pb2

pytestmark = pytest.mark.slow

TESTS_DIR = str(Path(__file__).resolve().parents[1])
ENVIRONMENT_MODULE = "rollway.environment"
NUM_STEPS = 6


def test_a_killed_managed_environment_is_restarted_and_the_run_finishes(
    tmp_path, tiny_model_dir, demo_data_dir
):
    config = {
        "hf_checkpoint": str(tiny_model_dir),
        "prompt_data": [str(demo_data_dir / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 4,
        "global_batch_size": 8,
        "num_rollout": NUM_STEPS,
        "rollout_max_response_len": 6,
        "lr": 1e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        # Most tokens end the random model's turn with "stop", so the environment takes a step.
        "rollout_stop_token_ids": list(range(3, 300)),
        "environment": "remote",
        # Step 1 answers " obs 1." with reward 0.5 and ends the episode.
        "remote_environment": "support.remote_environments:ScriptedEnvironment",
        "restart_backoff_seconds": 0.1,
    }
    env = {"PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with ServiceProcess(
        "coordinator", ["--runs-root", str(tmp_path / "runs")], tmp_path, env=env
    ) as coordinator:
        run = run_killing_its_environment(coordinator, "env", config, ENVIRONMENT_MODULE)
    info, first, first_address, replaced = run.info, run.first, run.first_address, run.replaced
    run_dir = tmp_path / "runs" / "env"

    assert info.state == coordinator_pb2.RUN_STATE_SUCCEEDED, info.error
    assert (info.step, info.num_steps) == (NUM_STEPS, NUM_STEPS)
    assert info.num_restarts == 1
    assert len(replaced) == 1 and replaced[0] != first
    assert sorted(info.service_addresses) == ["dataloader", "environment", "rollout_0", "trainer"]
    # The new process serves the dead one's address: the rollout services were not re-initialised.
    assert info.service_addresses["environment"] == first_address
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in trained_steps(run_dir)] == list(range(NUM_STEPS))  # each step once
    # Every sample was an episode of the environment's process: its reward is the step's 0.5,
    # but for samples in flight at the kill (FAILED: reward 0, not trained on).
    rewards = [r["rollout/raw_reward"] for r in records if "rollout/raw_reward" in r]
    assert len(rewards) == NUM_STEPS and rewards[0] == rewards[-1] == pytest.approx(0.5), rewards
    assert all(0.0 <= r <= 0.5 for r in rewards), rewards
    # The restart is reported by every step logged after it, by none before. (Steps go on while
    # the environment restarts: which step is the first after it, if any, depends on the load.)
    [notice] = [n for n in read_notices(run_dir) if n["notice"].startswith("recovered: environment")]
    after = [r for r in records if "train/grad_norm" in r and r["time"] > notice["time"]]
    assert all(r["fault/num_restarts"] == 1.0 for r in after), records
    assert "fault/num_restarts" not in records[0]  # step 0, logged before the kill
    result = json.loads((run_dir / "result.json").read_text())
    assert [r["service"] for r in result["recoveries"]] == ["environment"]
    assert not wait_all_gone([first, *replaced], 10)  # stopped with the run
