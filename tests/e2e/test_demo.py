"""`rollway demo` (make run), shortened: it runs SFT then GRPO and writes summary.json."""

import json
import subprocess
import sys


def test_short_demo_writes_its_summary(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollway.cli",
            "demo",
            "--workdir",
            str(tmp_path),
            "--sft-steps",
            "5",
            "--rl-steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (demo_dir,) = tmp_path.iterdir()
    summary = json.loads((demo_dir / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and summary["sft_steps"] == 5
    assert 0.0 <= summary["accuracy_before_rl"] <= 1.0 and 0.0 <= summary["accuracy_after_rl"] <= 1.0
    assert summary["wall_seconds"] > 0 and summary["run_dir"] == str(demo_dir)
    assert f"summary: {demo_dir / 'summary.json'}" in result.stdout
    assert "held-out accuracy before RL:" in result.stdout
    assert all(path.endswith(".png") for path in summary["plots"]) and summary["plots"]
    assert (demo_dir / "configs" / "grpo.yaml").exists()


def test_the_stopping_rule_runs_sft_in_chunks_on_the_same_services(tmp_path):
    """Without --sft-steps SFT runs chunk after chunk, each resuming the last one's checkpoint, until
    the rule stops it (here the cap: a threshold no model reaches); every run attaches to the
    services the demo started once."""
    script = (
        "import sys; from rollway.demo import addition as demo;"
        "demo.SFT_CHUNK, demo.SFT_MAX_STEPS, demo.SFT_STOP_DEV_ACCURACY = 3, 6, 2.0;"
        f"sys.exit(demo.main(['--workdir', {str(tmp_path)!r}, '--rl-steps', '2']))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (demo_dir,) = tmp_path.iterdir()
    summary = json.loads((demo_dir / "summary.json").read_text())
    assert [c["sft_steps"] for c in summary["sft_dev_accuracy"]] == [3, 6] and summary["sft_steps"] == 6
    metrics = [
        json.loads(line) for line in (demo_dir / "runs" / "sft" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in metrics if "sft/loss" in r] == list(range(6))  # the second chunk resumed
    assert result.stdout.count("== SFT: to step") == 2
    runs = {
        name: json.loads((demo_dir / "runs" / name / "config.json").read_text())["coordinator"]
        for name in ("sft", "grpo")
    }
    # Both runs on the services the demo started once (their port files), none started by a run.
    started = {
        path.name.split("-")[0]: f"127.0.0.1:{path.read_text().strip()}"
        for path in (demo_dir / "services").glob("*.port")
    }
    assert sorted(started) == ["dataloader", "rollout", "trainer"]
    for name in ("sft", "grpo"):
        assert (runs[name]["trainer_addr"], runs[name]["dataloader_addr"]) == (
            started["trainer"],
            started["dataloader"],
        )
    assert runs["grpo"]["rollout_addr"] == [started["rollout"]]
