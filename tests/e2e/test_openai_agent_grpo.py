"""GRPO through the coordinator with docs/environments.md's example agent (the `openai` client against the
rollout service's OpenAI-compatible endpoint): every sample is an agent episode, trained on with
its model tokens masked in, the rewards the agent returned, and rollout log-probs that match the
trainer's at the first step."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from support.tool_calling_model import ANSWER, QUESTION, make_tool_calling_model
from transformers import AutoTokenizer

from rollway.common.v1 import common_pb2
from rollway.coordinator.debug_data import load_rollout

pytestmark = pytest.mark.slow

NUM_STEPS = 2


def test_grpo_on_openai_agent_episodes(tiny_model_dir, tmp_path):
    model = make_tool_calling_model(tiny_model_dir, tmp_path / "tool-model")
    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps({"prompt": QUESTION, "label": ANSWER}) + "\n" for _ in range(8)))
    dump = str(tmp_path / "rollouts" / "rollout_{rollout_id}.pb")
    config = {
        "run_id": "agent-grpo",
        "run_dir": str(tmp_path / "runs"),
        "hf_checkpoint": str(model),
        "loss_type": "policy_loss",
        "advantage_estimator": "grpo",
        "prompt_data": [str(data)],
        "input_key": "prompt",
        "label_key": "label",
        "num_epoch": 0,
        "num_rollout": NUM_STEPS,
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 4,
        "global_batch_size": 8,
        "rollout_temperature": 1.0,
        "rollout_max_response_len": 96,  # per model turn: the tool call is ~70 tokens
        "environment": "agent",
        "agent_function_path": "rollway.demo.openai_agent:calculator_agent",
        "generate_max_turns": 3,
        "lr": 1e-4,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        "save_debug_rollout_data": dump,
    }
    path = tmp_path / "agent-grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "rollway.cli", "run", str(path)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "agent-grpo"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(NUM_STEPS))
    assert all(m["rollout/num_samples"] == 8.0 for m in metrics)
    # The trainer's log-probs of the model tokens equal the engine's at the first step (same weights).
    assert metrics[0]["train/train_rollout_logprob_abs_diff"] < 1e-3
    tokenizer = AutoTokenizer.from_pretrained(model)
    rewards = []
    for step in range(NUM_STEPS):
        samples = load_rollout(dump, step)
        assert len(samples) == 8
        for s in samples:
            roles = [t.role for t in s.turns]
            assert roles[0] == "model" and set(roles) <= {"model", "environment"}
            # The sample's prompt is the agent's first request, rendered by the chat template.
            assert tokenizer.decode(list(s.prompt_token_ids)).startswith("<|im_start|>user\n" + QUESTION)
            mask, start, last_model = [], 0, None
            for turn in s.turns:
                model_turn = turn.role == "model"
                mask += [int(model_turn)] * turn.num_tokens
                if model_turn:
                    last_model = s.response_token_ids[start : start + turn.num_tokens]
                else:
                    assert set(s.rollout_log_probs[start : start + turn.num_tokens]) == {0.0}
                start += turn.num_tokens
            assert list(s.loss_mask) == mask and start == len(s.response_token_ids)
            # The reward is the one the agent returned: 1.0 exactly when its final answer is right.
            answered = tokenizer.decode(list(last_model), skip_special_tokens=True).strip() == ANSWER
            if s.finish_reason == common_pb2.FINISH_REASON_STOP:  # the agent saw its answer
                assert s.reward == float(answered)
            rewards.append(s.reward)
    # The fitted model mostly calls the tool and answers right; every reward is the agent's 0 or 1.
    assert set(rewards) <= {0.0, 1.0} and 1.0 in rewards
    assert [m["rollout/raw_reward"] for m in metrics] == [
        sum(rewards[i * 8 : (i + 1) * 8]) / 8 for i in range(NUM_STEPS)
    ]
