"""GRPO on the tiny model with an OpenEnv environment the coordinator serves (openenv_app): the
rollout services get its URL, every sample is an episode of the OpenEnv server (masks, the
observation's tokens, the environment's rewards, log-prob parity on the model's tokens), the
server is killed -9 mid-run and restarted on its port, the run finishes, and the server is
stopped with the run."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from support.openenv_envs import WRONG_REWARD
from support.processes import ServiceProcess, wait_all_gone
from support.run_environment import run_killing_its_environment, trained_steps
from transformers import AutoTokenizer

from rollway.common.v1 import common_pb2
from rollway.coordinator import debug_data
from rollway.coordinator.v1 import coordinator_pb2

pytestmark = pytest.mark.slow

TESTS_DIR = str(Path(__file__).resolve().parents[1])
ENVIRONMENT_MODULE = "rollway.openenv_host"
NUM_STEPS = 3


def check_episode(sample: common_pb2.Sample, wrong: tuple[int, ...], tokenizer) -> None:
    """Model turns (mask 1) alternate with the environment's " Wrong, try again." (mask 0, log-prob
    0); the reward is the environment's for the model's answers (support/openenv_envs.py)."""
    position, answers = 0, []
    for turn in sample.turns:
        ids = tuple(sample.response_token_ids[position : position + turn.num_tokens])
        mask = list(sample.loss_mask[position : position + turn.num_tokens])
        if turn.role == "environment":
            assert ids == wrong and mask == [0] * len(ids)
        else:
            assert turn.role == "model" and mask == [1] * len(ids)
            answers.append(tokenizer.decode(list(ids), skip_special_tokens=True))
        position += turn.num_tokens
    assert position == len(sample.response_token_ids) == len(sample.loss_mask)
    right = [bool(n) and n[-1] == sample.label for n in (re.findall(r"-?\d+", a) for a in answers)]
    assert sample.reward == pytest.approx(sum(1.0 if r else WRONG_REWARD for r in right))


def test_grpo_runs_on_a_managed_openenv_server_that_is_killed_and_restarted(
    tmp_path, tiny_model_dir, demo_data_dir
):
    debug_path = str(tmp_path / "rollouts" / "step_{rollout_id}.pt")
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
        "rollout_max_response_len": 24,
        "lr": 1e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        # Most tokens end the random model's turn with "stop": the environment answers, twice.
        "rollout_stop_token_ids": list(range(3, 300)),
        "environment": "openenv",
        "openenv_app": "support.openenv_envs:app",
        "restart_backoff_seconds": 0.1,
        "save_debug_rollout_data": debug_path,
    }
    env = {"PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with ServiceProcess(
        "coordinator", ["--runs-root", str(tmp_path / "runs")], tmp_path, env=env
    ) as coordinator:
        run = run_killing_its_environment(coordinator, "openenv", config, ENVIRONMENT_MODULE)
    info, first, first_address, replaced = run.info, run.first, run.first_address, run.replaced
    run_dir = tmp_path / "runs" / "openenv"

    assert info.state == coordinator_pb2.RUN_STATE_SUCCEEDED, info.error
    assert (info.step, info.num_steps) == (NUM_STEPS, NUM_STEPS)
    assert info.num_restarts == 1 and len(replaced) == 1
    assert info.service_addresses["environment"] == first_address  # restarted on its port
    steps = trained_steps(run_dir)
    assert [r["step"] for r in steps] == list(range(NUM_STEPS))
    # The trainer's log-probs of the model's tokens equal the engine's (environment tokens are
    # masked out of the comparison as they are of the loss).
    assert all(r["train/train_rollout_logprob_abs_diff"] < 1e-3 for r in steps), steps
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    wrong = tuple(tokenizer.encode(" Wrong, try again.", add_special_tokens=False))
    samples = [s for step in range(NUM_STEPS) for s in debug_data.load_rollout(debug_path, step)]
    finished = [s for s in samples if s.finish_reason != common_pb2.FINISH_REASON_FAILED]
    assert len(samples) == NUM_STEPS * 8 and len(finished) >= NUM_STEPS * 8 - 8  # in flight at the kill
    assert any(len(s.turns) >= 3 for s in finished)  # the environment answered, the model again
    for sample in finished:
        check_episode(sample, wrong, tokenizer)
    # Step 0 ran before the kill: its reward metric is the mean of its episodes' rewards.
    step_0 = debug_data.load_rollout(debug_path, 0)
    assert all(s.finish_reason != common_pb2.FINISH_REASON_FAILED for s in step_0)
    assert steps[0]["rollout/raw_reward"] == pytest.approx(sum(s.reward for s in step_0) / len(step_0))
    assert not wait_all_gone([first, *replaced], 10)  # stopped with the run
