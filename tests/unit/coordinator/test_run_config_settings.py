"""A run's settings are honoured or refused, never replaced: num_steps_per_rollout against the
batch arithmetic, and the rollout process's Generate-queue settings (not a run's to set)."""

from __future__ import annotations

import pytest
from support.run_configs import problems

from rollway.coordinator.run_config import parse_run_config


def grpo(model, **extra) -> dict:
    return {
        "hf_checkpoint": str(model),
        "prompt_data": ["/data/rl.parquet"],
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "rollout_max_response_len": 8,
        **extra,
    }


def test_num_steps_per_rollout_alone_sets_the_global_batch_size(model_dir):
    run = parse_run_config(grpo(model_dir, num_steps_per_rollout=4))
    assert run.coordinator.global_batch_size == 4  # 16 samples per rollout in 4 optimizer steps
    assert run.service_settings("trainer")["num_steps_per_rollout"] == 4


def test_num_steps_per_rollout_agreeing_with_the_global_batch_size_is_kept(model_dir):
    run = parse_run_config(grpo(model_dir, num_steps_per_rollout=2, global_batch_size=8))
    assert run.service_settings("trainer")["num_steps_per_rollout"] == 2
    sft = parse_run_config(
        {**grpo(model_dir, num_steps_per_rollout=2), "loss_type": "sft_loss", "apply_chat_template": True}
    )
    assert sft.coordinator.global_batch_size == 2  # SFT: rollout_batch_size conversations per step


def test_a_num_steps_per_rollout_the_batch_arithmetic_contradicts_is_refused(model_dir):
    problem = problems(grpo(model_dir, num_steps_per_rollout=4, global_batch_size=16))[
        "num_steps_per_rollout"
    ]
    assert "contradicts global_batch_size 16" in problem and "n_samples_per_prompt = 16" in problem
    nested = grpo(model_dir, global_batch_size=8, trainer_settings={"num_steps_per_rollout": 3})
    assert "contradicts global_batch_size 8" in problems(nested)["num_steps_per_rollout"]
    assert "does not divide" in problems(grpo(model_dir, num_steps_per_rollout=3))["num_steps_per_rollout"]


@pytest.mark.parametrize(
    "name, flag",
    [
        ("max_generate_calls", "--max-generate-calls"),
        ("generate_queue_size", "--generate-queue-size"),
        ("generate_queue_timeout", "--generate-queue-timeout"),
    ],
)
def test_the_rollout_process_settings_are_refused_naming_the_service_flag(model_dir, name, flag):
    problem = problems(grpo(model_dir, global_batch_size=16, **{name: 2}))[name]
    assert "rollout service process" in problem and flag in problem


def test_an_over_sampling_batch_below_the_rollout_batch_is_refused_not_raised(model_dir):
    """Miles asserts over_sampling_batch_size >= rollout_batch_size; rollway used to raise a smaller
    value silently on each refill. 0 (unset) asks for the missing prompts only."""
    problem = problems(grpo(model_dir, global_batch_size=16, over_sampling_batch_size=2))[
        "over_sampling_batch_size"
    ]
    assert "at least rollout_batch_size = 4" in problem and "got 2" in problem
    for kept in (0, 4, 6):
        run = parse_run_config(grpo(model_dir, global_batch_size=16, over_sampling_batch_size=kept))
        assert run.coordinator.over_sampling_batch_size == kept


def test_a_remote_or_custom_reward_without_its_source_is_refused_naming_the_setting(model_dir):
    assert "needs rm_url" in problems(grpo(model_dir, global_batch_size=16, rm_type="remote"))["rm_url"]
    custom = problems(grpo(model_dir, global_batch_size=16, rm_type="custom"))
    assert "needs custom_rm_path: module:function" in custom["custom_rm_path"]
    run = parse_run_config(
        grpo(model_dir, global_batch_size=16, rm_type="remote", rm_url="http://127.0.0.1:9/r")
    )
    assert run.rollout.rm_url == "http://127.0.0.1:9/r"
