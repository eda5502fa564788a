"""bench/bench_vs_trl_smollm2.py's configs: rollway's SFT and GRPO runs of the real model, and the
TRL runner's flags derived from them, are the same work (the bench itself is not run here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_vs_trl_smollm2 import smollm2_configs, trl_runner_args
from rollway.coordinator.run_config import parse_run_config

MODEL, DATA = Path("/models/smollm2"), Path("/data")


def test_grpo_is_the_demos_without_evaluation_and_trl_gets_the_same_batch():
    grpo = smollm2_configs(MODEL, DATA, sft_steps=6, grpo_steps=6)["grpo"]
    assert grpo["num_rollout"] == 6 and grpo["hf_checkpoint"] == str(MODEL)
    assert grpo["prompt_data"] == [str(DATA / "rl.parquet")]
    assert not {"run_id", "run_dir", "eval_prompt_data", "eval_interval", "save", "save_hf"} & grpo.keys()
    assert (grpo["rollout_batch_size"], grpo["n_samples_per_prompt"], grpo["global_batch_size"]) == (8, 8, 64)
    assert (grpo["rollout_max_response_len"], grpo["lr"], grpo["max_tokens_per_gpu"]) == (32, 2e-5, 2048)
    assert trl_runner_args("grpo", grpo) == (
        "--batch-size",
        "64",
        "--lr",
        "2e-05",
        "--num-generations",
        "8",
        "--max-completion-length",
        "32",
        "--reward",
        "last-number",
    )


def test_sft_is_the_real_model_tests_and_trl_gets_the_same_batch():
    sft = smollm2_configs(MODEL, DATA, sft_steps=6, grpo_steps=6)["sft"]
    assert sft["loss_type"] == "sft_loss" and sft["num_rollout"] == 6
    assert sft["prompt_data"] == [str(DATA / "sft.parquet")] and sft["input_key"] == "messages"
    assert (sft["rollout_batch_size"], sft["global_batch_size"], sft["lr"]) == (16, 16, 1e-5)
    assert trl_runner_args("sft", sft) == ("--batch-size", "16", "--lr", "1e-05")


def test_both_configs_pass_the_run_config_validation(tmp_path):
    # The validation reads the model's config.json (SmolLM2's context length); nothing else of it.
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "max_position_embeddings": 8192})
    )
    for config in smollm2_configs(tmp_path, DATA, sft_steps=6, grpo_steps=6).values():
        parse_run_config({**config, "run_id": "bench"})  # raises RunConfigError naming each problem


@pytest.mark.parametrize(
    "change",
    [
        {"lr_decay_style": "cosine"},
        {"rm_type": "f1"},
        {"global_batch_size": 32},
        {"rollout_temperature": 0.7},
    ],
)
def test_work_trl_runner_cannot_reproduce_is_refused(change):
    grpo = smollm2_configs(MODEL, DATA, sft_steps=6, grpo_steps=6)["grpo"]
    with pytest.raises(ValueError):
        trl_runner_args("grpo", {**grpo, **change})
