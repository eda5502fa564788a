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
    assert lines["micro-batches"] == "4 per rank of 4 samples (packed rows)"
    assert lines["optimizer steps total"] == "40"


def test_plan_defaults_to_micro_batches_by_token_budget_and_shows_their_layout(tmp_path):
    """A config that says nothing about batching gets the fast path: dynamic batch size."""
    config = tmp_path / "run.yaml"
    config.write_text(
        "hf_checkpoint: /models/qwen\nprompt_data: [/data/rl.parquet]\nrollout_batch_size: 16\n"
        "n_samples_per_prompt: 8\nglobal_batch_size: 128\nrollout_max_prompt_len: 64\n"
        "rollout_max_response_len: 8\nmax_tokens_per_gpu: 1024\n"
    )
    result = rollway("plan", str(config))
    assert result.returncode == 0, result.stderr
    lines = {line[:25].strip(): line[25:].strip() for line in result.stdout.splitlines()}
    assert lines["micro-batches"] == "by token budget: up to 1024 tokens each per rank (packed rows)"
    # 128 samples of at most 72 tokens: 14 fit in 1024 tokens -> 10 micro-batches
    assert lines["micro-batch layout"] == (
        "samples of up to 72 tokens: >= 14 per micro-batch, at most 10 micro-batches per rank per step"
    )


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


def test_a_crashed_service_is_reported_with_its_log_and_everything_stops(
    tiny_model_dir, demo_data_dir, tmp_path
):
    import os
    import re
    import signal
    import time

    config = tmp_path / "run.yaml"
    config.write_text(
        f"hf_checkpoint: {tiny_model_dir}\nprompt_data: [{demo_data_dir / 'rl.parquet'}]\ninput_key: prompt\n"
        "label_key: label\napply_chat_template: true\nnum_epoch: 0\nnum_rollout: 1000\nrollout_batch_size: 4\n"
        "n_samples_per_prompt: 4\nglobal_batch_size: 16\nrollout_max_response_len: 4\n"
        f"run_dir: {tmp_path / 'runs'}\nrun_id: crash\n"
    )
    launcher = subprocess.Popen(
        [*ROLLWAY, "run", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pids = {}
    try:
        for line in launcher.stdout:
            match = re.match(r"(\w+) pid (\d+) at ", line)
            if match:
                pids[match.group(1)] = int(match.group(2))
            if line.startswith("step 2/"):  # the run is training: kill the rollout service
                break
        os.kill(pids["rollout"], signal.SIGKILL)
        out, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1
    assert f"service crashed: rollout (pid {pids['rollout']}) exited with -9; last log lines:" in err
    assert '"service": "rollout"' in err  # the tail of the rollout service's own log
    time.sleep(1)
    for name, pid in pids.items():  # the launcher stopped every service it started, by pid
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", name
