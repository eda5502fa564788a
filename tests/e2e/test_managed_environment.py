"""An Environment service the coordinator starts for a run (remote_environment): the rollout
services get its address, it is killed -9 mid-run, the coordinator restarts it (a new process on
the same port) while the run goes on without a checkpoint to go back to, the run finishes every
step, and the environment is stopped with the run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from support.processes import ServiceProcess, descendants_running, wait_all_gone
from support.stack import coordinator_stub, start_run, wait_run
from support.waiting import wait_until

from rollway.coordinator.dashboard.run_files import read_notices
from rollway.coordinator.v1 import coordinator_pb2

pytestmark = pytest.mark.slow

TESTS_DIR = str(Path(__file__).resolve().parents[1])
ENVIRONMENT_MODULE = "rollway.rollout.environments"
NUM_STEPS = 6


def steps_logged(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r["step"] for r in records if "train/grad_norm" in r]


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
        stub = coordinator_stub(coordinator)
        run_dir = tmp_path / "runs" / "env"
        started = start_run(stub, "env", config)
        wait_until(lambda: steps_logged(run_dir), 120, "the run's first step")
        [first] = descendants_running(coordinator.pid, ENVIRONMENT_MODULE)
        running = stub.GetRun(coordinator_pb2.GetRunRequest(run_id=started.run_id)).run
        first_address = running.service_addresses["environment"]
        os.kill(first, signal.SIGKILL)
        replaced: list[int] = []
        wait_until(
            lambda: (
                replaced.extend(
                    p for p in descendants_running(coordinator.pid, ENVIRONMENT_MODULE) if p != first
                )
                or replaced
            ),
            60,
            "a new environment process",
        )
        info = wait_run(stub, started.run_id, timeout=180)

    assert info.state == coordinator_pb2.RUN_STATE_SUCCEEDED, info.error
    assert (info.step, info.num_steps) == (NUM_STEPS, NUM_STEPS)
    assert info.num_restarts == 1
    assert len(replaced) == 1 and replaced[0] != first
    assert sorted(info.service_addresses) == ["dataloader", "environment", "rollout_0", "trainer"]
    # The new process serves the dead one's address: the rollout services were not re-initialised.
    assert info.service_addresses["environment"] == first_address
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps_logged(run_dir) == list(range(NUM_STEPS))  # each step once
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
