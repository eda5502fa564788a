"""The rollway command line: plan, config errors before anything starts, plot."""

from __future__ import annotations

import subprocess
import sys

import pytest

ROLLWAY = [sys.executable, "-m", "rollway.cli"]


def rollway(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*ROLLWAY, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_plan_prints_the_batch_arithmetic(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "hf_checkpoint: /models/qwen\nprompt_data: [/data/rl.parquet]\nrollout_batch_size: 16\n"
        "n_samples_per_prompt: 8\nglobal_batch_size: 32\nnum_rollout: 10\nworld_size: 2\nmicro_batch_size: 4\n"
    )
    result = rollway("plan", str(config))
    assert result.returncode == 0, result.stderr
    # "label                    value" lines: the label is padded to 25 columns
    lines = {line[:25].strip(): line[25:].strip() for line in result.stdout.splitlines()}
    assert lines["samples per rollout"] == "128"
    assert lines["optimizer steps/rollout"] == "4"
    assert lines["trainer ranks"] == "2 (16 samples per rank per step)"
    assert lines["micro-batches"] == "4 per rank of 4 samples"
    assert lines["optimizer steps total"] == "40"


@pytest.mark.parametrize(
    ("yaml_text", "flags", "message"),
    [
        ("rollout_batch_size: 3\nn_samples_per_prompt: 3\nglobal_batch_size: 4\n", [], "global_batch_size:"),
        ("lr: fast\n", [], "lr: must be a number"),
        ("rollout_batch_szie: 4\n", [], "did you mean rollout_batch_size"),
        ("", ["--advantage-estimator", "ppo"], "advantage_estimator: must be one of"),
        ("", ["--use-kl-loss", "--kl-coef", "0.1"], "kl_coef"),
    ],
)
def test_config_errors_name_the_setting_before_anything_starts(tmp_path, yaml_text, flags, message):
    config = tmp_path / "run.yaml"
    config.write_text("hf_checkpoint: /models/qwen\nprompt_data: [/data/rl.parquet]\n" + yaml_text)
    result = rollway("run", str(config), *flags, "--run-dir", str(tmp_path / "runs"))
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "runs").exists(), "nothing may start before the config is valid"
