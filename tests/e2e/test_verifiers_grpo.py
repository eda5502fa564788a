"""GRPO through --environment verifiers, with docs/environments.md's example ("verifiers environments"): its
taskset module (verifiers' own classes on the demo's addition data, a Python function tool), its
prompts exported for the dataloader and its run config, run by the coordinator with every service
started for the run on the tiny model. The rubric's reward rises and its parts reach metrics.jsonl
as rollout/env/<name>."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from support.processes import ServiceProcess
from support.stack import coordinator_stub, start_run, wait_run

from rollway.coordinator.v1 import coordinator_pb2
from rollway.rollout.environments.verifiers_env import export_prompts

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
NUM_STEPS = 6
# The tiny model's random weights: a large step, and most tokens end a turn so that every turn is
# answered within rollout_max_response_len (the page says so next to the example).
TINY_MODEL_SETTINGS = {
    "lr": 1e-2,
    "rollout_max_response_len": 4,
    "rollout_stop_token_ids": list(range(3, 300)),
    "num_rollout": NUM_STEPS,
    "seed": 3,
    "sampling_seed": 1,
    "use_dynamic_batch_size": True,
    "max_tokens_per_gpu": 4096,
}


def readme_block(first_line: str) -> str:
    """The fenced code block of README whose first line starts with `first_line`."""
    for block in re.findall(r"```\w*\n(.*?)```", README.read_text(), re.DOTALL):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"docs/environments.md has no code block starting with {first_line!r}")


def test_readme_verifiers_example_runs_grpo_and_its_reward_rises(
    tmp_path, tiny_model_dir, demo_data_dir, monkeypatch
):
    (tmp_path / "vf_addition.py").write_text(readme_block("# vf_addition.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ADDITION_DATA", str(demo_data_dir / "rl.parquet"))
    prompts = tmp_path / "prompts.jsonl"
    assert export_prompts("vf_addition:load_taskset", prompts) == 64
    first = json.loads(prompts.read_text().splitlines()[0])
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert [t["function"]["name"] for t in first["tools"]] == ["add"]

    config = yaml.safe_load(readme_block("# vf_grpo.yaml"))
    assert config["environment"] == "verifiers" and config["verifiers_taskset"] == "vf_addition:load_taskset"
    config.update(TINY_MODEL_SETTINGS, hf_checkpoint=str(tiny_model_dir), prompt_data=[str(prompts)])
    env = {
        "PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "ADDITION_DATA": str(demo_data_dir / "rl.parquet"),
    }
    with ServiceProcess(
        "coordinator", ["--runs-root", str(tmp_path / "runs")], tmp_path, env=env
    ) as coordinator:
        stub = coordinator_stub(coordinator)
        start_run(stub, "vf", config)
        final = wait_run(stub, "vf")
    assert final.state == coordinator_pb2.RUN_STATE_SUCCEEDED, final.error

    records = [
        json.loads(line) for line in (tmp_path / "runs" / "vf" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if "rollout/raw_reward" in r]
    assert [r["step"] for r in steps] == list(range(NUM_STEPS))
    rewards = [r["rollout/raw_reward"] for r in steps]
    print("raw reward per step:", [round(x, 3) for x in rewards])
    for r in steps:
        # The reward is the rubric's weighted sum of its parts (correct: 1, starts_with_digit: 0.5),
        # averaged over the same samples.
        parts = r["rollout/env/correct"] + 0.5 * r["rollout/env/starts_with_digit"]
        assert r["rollout/raw_reward"] == pytest.approx(parts, abs=1e-6)
        assert r["rollout/env/num_tool_calls"] == 0.0 and r["rollout/reward_errors"] == 0.0
        # The trainer scores exactly the sampled tokens: its log-probs equal the engine's.
        assert r["train/train_rollout_logprob_abs_diff"] < 1e-4
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards
