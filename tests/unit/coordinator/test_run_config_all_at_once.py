"""Parsing a run config reports every problem at once: an unknown key or a bad value hides neither
the cross-setting checks nor the data's, and an invalid value never crashes a later check."""

from __future__ import annotations

import pytest

from rollway.coordinator.run_config import RunConfigError, parse_run_config


def test_unknown_keys_bad_values_and_validation_are_reported_together(tiny_model_dir, demo_data_dir):
    config = {
        "hf_checkpoint": str(tiny_model_dir),
        "prompt_data": [str(demo_data_dir / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "loss_type": "sft_loss",
        "rollout_batch_size": 0,  # validate(): must be positive (and num_rollout 0 divides by it)
        "global_batch_size": 8,
        "num_rollout": 0,
        "lr": float("nan"),
        "nope": 1,
    }
    with pytest.raises(RunConfigError) as refused:
        parse_run_config(config, check_files=True, strict=True)
    assert dict(refused.value.problems) == {
        "nope": "unknown setting",
        "lr": "must be a finite number (got nan)",
        "rollout_batch_size": "must be positive (got 0)",
    }


def test_a_missing_data_file_is_a_precondition_and_a_missing_column_is_not(
    tiny_model_dir, demo_data_dir, tmp_path
):
    base = {
        "hf_checkpoint": str(tiny_model_dir),
        "input_key": "messages",
        "label_key": "answer",
        "apply_chat_template": True,
        "loss_type": "sft_loss",
        "rollout_batch_size": 8,
        "global_batch_size": 8,
    }
    with pytest.raises(RunConfigError) as refused:
        parse_run_config({**base, "prompt_data": [str(tmp_path / "gone.jsonl")]}, check_files=True)
    assert refused.value.problems == [("prompt_data", f"{tmp_path / 'gone.jsonl'}: no such file")]
    assert refused.value.preconditions == {"prompt_data"}
    with pytest.raises(RunConfigError) as refused:
        parse_run_config({**base, "prompt_data": [str(demo_data_dir / "sft.parquet")]}, check_files=True)
    assert [setting for setting, _ in refused.value.problems] == ["label_key"]
    assert refused.value.preconditions == set()
    # Without check_files (a config written for another machine) a missing file is no problem.
    run = parse_run_config(
        {**base, "label_key": "", "prompt_data": [str(tmp_path / "gone.jsonl")], "num_rollout": 4}
    )
    assert run.coordinator.num_rollout == 4


def test_every_problem_a_components_validation_finds_is_reported_not_only_its_first(
    tiny_model_dir, demo_data_dir
):
    config = {
        "hf_checkpoint": str(tiny_model_dir),
        "prompt_data": [str(demo_data_dir / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        # Three rules across settings the coordinator's validate() checks, one after the other.
        "mask_offpolicy_in_partial_rollout": True,
        "ray_address": "ray://head:10001",
        "debug_rollout_only": True,
        "debug_train_only": True,
    }
    with pytest.raises(RunConfigError) as refused:
        parse_run_config(config)
    problems = dict(refused.value.problems)
    assert problems["mask_offpolicy_in_partial_rollout"] == "needs partial_rollout"
    assert problems["ray_address"] == "needs launcher ray"
    assert problems["debug_rollout_only"].startswith("cannot be combined with debug_train_only")


@pytest.mark.parametrize("loss_type", ["sftloss", "ppo", ""])
def test_a_bad_loss_type_is_refused_alone_with_no_knock_on_for_settings_never_sent(
    tiny_model_dir, demo_data_dir, loss_type
):
    """#38: a bad loss_type also drew a violation for a setting the client never sent (the run's
    mode is unknown, so neither the SFT nor the RL rules may speak)."""
    config = {
        "hf_checkpoint": str(tiny_model_dir),
        "prompt_data": [str(demo_data_dir / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "loss_type": loss_type,
    }
    with pytest.raises(RunConfigError) as refused:
        parse_run_config(config, check_files=True, strict=True)
    assert [setting for setting, _ in refused.value.problems] == ["loss_type"], refused.value.problems
