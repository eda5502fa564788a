"""StartRun's model checks: the run config's hf_checkpoint read from its config.json, before any
service starts (for the services the coordinator starts; attached ones check their own)."""

from __future__ import annotations

import json

from support.run_configs import problems

from rollway.coordinator.run_config import parse_run_config


def grpo(model, **extra) -> dict:
    return {
        "hf_checkpoint": str(model),
        "prompt_data": ["/data/rl.parquet"],
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "global_batch_size": 4,
        "rollout_max_response_len": 8,
        **extra,
    }


def test_a_response_as_long_as_the_context_is_refused_naming_it(model_dir):
    found = problems(grpo(model_dir, rollout_max_response_len=1024))
    assert list(found) == ["rollout_max_response_len"]
    assert found["rollout_max_response_len"].startswith("1024 leaves no room for a prompt")
    assert f"max_position_embeddings in {model_dir / 'config.json'}" in found["rollout_max_response_len"]
    # The default (1024 tokens) does not fit this model either.
    assert "rollout_max_response_len" in problems({**grpo(model_dir), "rollout_max_response_len": 2000})
    assert (
        parse_run_config(grpo(model_dir, rollout_max_response_len=1023)).coordinator.rollout_max_response_len
        == 1023
    )


def test_rollout_max_context_len_when_set_is_the_context(model_dir):
    found = problems(grpo(model_dir, rollout_max_context_len=64, rollout_max_response_len=64))
    assert "rollout_max_context_len 64" in found["rollout_max_response_len"]
    parse_run_config(grpo(model_dir, rollout_max_context_len=2048, rollout_max_response_len=1500))


def test_a_prompt_limit_plus_the_response_must_fit(model_dir):
    found = problems(grpo(model_dir, rollout_max_prompt_len=1000, rollout_max_response_len=100))
    assert (
        "plus rollout_max_prompt_len 1000 exceeds the model's context of 1024"
        in found["rollout_max_response_len"]
    )
    parse_run_config(grpo(model_dir, rollout_max_prompt_len=924, rollout_max_response_len=100))


def test_a_model_nested_text_config_or_none_at_all(tmp_path):
    nested = tmp_path / "vlm"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 32}}))
    assert "rollout_max_response_len" in problems(grpo(nested, rollout_max_response_len=32))
    silent = tmp_path / "silent"
    silent.mkdir()
    (silent / "config.json").write_text("{}")  # no context length: the rollout checks each request
    parse_run_config(grpo(silent, rollout_max_response_len=100_000))


def test_a_model_path_that_is_no_model_directory_is_refused_naming_it(tmp_path, model_dir):
    missing = problems(grpo(tmp_path / "nowhere"))
    assert missing == {
        "hf_checkpoint": f"{tmp_path / 'nowhere'} does not exist "
        "(the run starts dataloader, rollout, trainer, which load it)"
    }
    empty = tmp_path / "empty"
    empty.mkdir()
    assert problems(grpo(empty)) == {
        "hf_checkpoint": f"{empty} is not a Hugging Face model directory (no config.json)"
    }
    (model_dir / "config.json").write_text("{not json")
    assert "cannot be read as JSON" in problems(grpo(model_dir))["hf_checkpoint"]


def test_every_error_at_once_with_the_model_check(tmp_path):
    found = problems(grpo(tmp_path / "nowhere", prompt_data=[], rollout_max_response_len=5000))
    assert {"hf_checkpoint", "prompt_data"} <= set(found)


def test_attached_services_check_their_own_model(tmp_path):
    attached = {
        "dataloader_addr": "127.0.0.1:1",
        "trainer_addr": "127.0.0.1:2",
        "rollout_addr": ["127.0.0.1:3"],
    }
    # A path on the services' machine and a response the coordinator cannot judge: accepted.
    parse_run_config(grpo(tmp_path / "theirs", rollout_max_response_len=5000, **attached))
    # With the rollout attached, a model the coordinator starts a trainer for is still checked,
    # but the response length is the rollout's to judge.
    found = problems(grpo(tmp_path / "nowhere", **{**attached, "trainer_addr": ""}))
    assert found["hf_checkpoint"].endswith("(the run starts trainer, which load it)")


def test_sft_runs_generate_nothing_so_the_response_length_does_not_matter(model_dir):
    sft = {
        "hf_checkpoint": str(model_dir),
        "prompt_data": ["/data/sft.parquet"],
        "input_key": "messages",
        "apply_chat_template": True,
        "loss_type": "sft_loss",
        "rollout_batch_size": 4,
        "global_batch_size": 4,
    }
    assert parse_run_config(sft).coordinator.rollout_max_response_len == 1024
