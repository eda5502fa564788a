"""`rollway demo --task tools`, shortened: two SFT runs, GRPO with the calculator environment, three
held-out evaluations through rollout services, and summary.json with the three accuracies. The
openai-agent demo reuses that demo's SFT models (--sft-from): only its GRPO stage differs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


def run_demo(workdir: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`rollway demo --task tools` as a user types it, shortened; its result and demo directory."""
    result = subprocess.run(
        [sys.executable, "-m", "rollway.cli", "demo", "--task", "tools", "--workdir", str(workdir),
         "--sft-steps", "3", "--rl-steps", "1", "--num-eval", "16", *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (demo_dir,) = workdir.iterdir()
    return result, demo_dir


@pytest.fixture(scope="module")
def builtin_demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The whole demo with the built-in calculator environment (its SFT models serve both tests)."""
    return run_demo(tmp_path_factory.mktemp("demo-tools"))


def test_short_tools_demo_writes_its_accuracies(builtin_demo):
    result, demo_dir = builtin_demo
    summary = json.loads((demo_dir / "summary.json").read_text())
    assert summary["sft_steps"] == 3 and summary["rl_steps"] == 1 and summary["num_eval"] == 16
    for key in ("accuracy_without_tools", "accuracy_after_sft", "accuracy_after_rl"):
        # 16 greedy answers: a multiple of 1/16 in [0, 1].
        assert 0.0 <= summary[key] <= 1.0 and (summary[key] * 16) == int(summary[key] * 16), key
    assert f"summary: {demo_dir / 'summary.json'}" in result.stdout
    assert "held-out accuracy with the calculator after RL:" in result.stdout
    # The GRPO run trained on episodes of the calculator environment.
    grpo = demo_dir / "runs" / "grpo-tools"
    records = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert any("rollout/raw_reward" in r for r in records)
    config = (demo_dir / "configs" / "grpo-tools.yaml").read_text()
    assert "environment: calculator" in config


def test_short_tools_demo_trains_through_an_openai_client_agent(builtin_demo, tmp_path):
    _, builtin_dir = builtin_demo
    result, demo_dir = run_demo(tmp_path, "--agent", "openai", "--sft-from", str(builtin_dir))
    summary = json.loads((demo_dir / "summary.json").read_text())
    assert summary["agent"] == "openai" and summary["rl_steps"] == 1
    # The SFT stage was the earlier demo's: its models, settings and accuracies, not run again.
    builtin = json.loads((builtin_dir / "summary.json").read_text())
    for key in ("sft_steps", "num_eval", "accuracy_without_tools", "accuracy_after_sft"):
        assert summary[key] == builtin[key], key
    assert not (demo_dir / "runs" / "sft-tools").exists(), "SFT ran again"
    assert 0.0 <= summary["accuracy_after_rl"] <= 1.0 and (summary["accuracy_after_rl"] * 16) % 1 == 0
    config = (demo_dir / "configs" / "grpo-tools.yaml").read_text()
    assert "environment: agent" in config and "rollway.demo.openai_agent:calculator_agent" in config
    assert str(builtin_dir / "sft-tools-export") in config, "GRPO did not start from the reused SFT model"
    # Every GRPO sample was an episode of the agent: its first request (chat-templated) is the prompt.
    grpo = demo_dir / "runs" / "grpo-tools"
    [record] = [
        json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    assert record["rollout/num_samples"] == 64.0 and 0.0 <= record["rollout/raw_reward"] <= 1.0
    assert "(openai agent)" in result.stdout
