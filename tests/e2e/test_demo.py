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
