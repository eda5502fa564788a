"""`rollway demo --task tools`, shortened: two SFT runs, GRPO with the calculator environment, three
held-out evaluations through rollout services, and summary.json with the three accuracies."""

import json
import subprocess
import sys


def test_short_tools_demo_writes_its_accuracies(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rollway.cli", "demo", "--task", "tools", "--workdir", str(tmp_path),
         "--sft-steps", "3", "--rl-steps", "1", "--num-eval", "16"],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (demo_dir,) = tmp_path.iterdir()
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


def test_short_tools_demo_trains_through_an_openai_client_agent(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rollway.cli", "demo", "--task", "tools", "--agent", "openai",
         "--workdir", str(tmp_path), "--sft-steps", "3", "--rl-steps", "1", "--num-eval", "16"],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (demo_dir,) = tmp_path.iterdir()
    summary = json.loads((demo_dir / "summary.json").read_text())
    assert summary["agent"] == "openai" and summary["rl_steps"] == 1
    config = (demo_dir / "configs" / "grpo-tools.yaml").read_text()
    assert "environment: agent" in config and "rollway.demo.openai_agent:calculator_agent" in config
    # Every GRPO sample was an episode of the agent: its first request (chat-templated) is the prompt.
    grpo = demo_dir / "runs" / "grpo-tools"
    [record] = [
        json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    assert record["rollout/num_samples"] == 64.0 and 0.0 <= record["rollout/raw_reward"] <= 1.0
    assert "(openai agent)" in result.stdout
