"""The cheap commands of README.md and docs/*.md, run as written (tests/unit/test_docs.py lists
them in RUN_HERE and checks that each has its test here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from unit.test_docs import ROOT, RUN_HERE, block_starting

ROLLWAY = str(Path(sys.executable).with_name("rollway"))


def test_make_targets_run_what_the_docs_say():
    def dry_run(target: str) -> str:
        result = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "rollway demo --workdir runs/demo" in dry_run("run")
    # The real-model demo's steps are tests/realmodel's (a GRPO run of the same config, 8 steps).
    assert "rollway demo --model smollm2 --workdir runs/demo-smollm2" in dry_run("run-smollm2")
    assert "-m pytest" in dry_run("test")
    fast = dry_run("test-fast")
    assert '-m "not slow"' in fast and "tests/unit" in fast


@pytest.fixture(scope="module")
def made_tiny_model(tmp_path_factory) -> Path:
    """`rollway make-tiny-model DIR`, run as the README runs it."""
    directory = tmp_path_factory.mktemp("docs") / "tiny"
    result = subprocess.run(
        [ROLLWAY, "make-tiny-model", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return directory


def plan(config_text: str, path: Path) -> str:
    path.write_text(config_text)
    result = subprocess.run([ROLLWAY, "plan", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return "\n".join(" ".join(line.split()) for line in result.stdout.splitlines())


# builds the tiny model through the CLI (~10-20 s)
def test_the_first_runs_plan_what_the_readme_says(made_tiny_model, tmp_path):
    readme = ROOT / "README.md"
    for name in ("sft.parquet", "rl.parquet", "eval.parquet"):
        assert (made_tiny_model / "data" / name).is_file()  # what the README's comment promises
    sft = block_starting(readme, "# sft.yaml").replace("/tmp/tiny", str(made_tiny_model))
    out = plan(sft, tmp_path / "sft.yaml")
    assert "mode SFT" in out and "samples per rollout 64" in out and "optimizer steps total 200" in out
    grpo = block_starting(readme, "# grpo.yaml").replace("/tmp/tiny", str(made_tiny_model))
    out = plan(grpo, tmp_path / "grpo.yaml")
    assert "mode RL (grpo)" in out and "samples per prompt 8" in out and "samples per rollout 128" in out
    assert "optimizer steps/rollout 1" in out  # "one optimizer step" a step, as the README says


def test_a_service_lists_its_flags():
    result = subprocess.run(
        [sys.executable, "-m", "rollway.dataloader", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "--prompt-data" in result.stdout and "--input-key" in result.stdout


# matplotlib in a fresh process
def test_plot_writes_the_charts_of_a_run(tmp_path):
    from rollway.coordinator.metrics import MetricsSink

    sink = MetricsSink(tmp_path, tensorboard=False)
    for step in range(3):
        sink.log(step, {"train/loss": 1.0 / (step + 1), "rollout/raw_reward": 0.1 * step})
    sink.close()
    result = subprocess.run([ROLLWAY, "plot", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    written = {Path(line.strip()).name for line in result.stdout.splitlines()}
    assert written == {"loss.png", "reward.png"}
    assert all((tmp_path / "plots" / name).stat().st_size > 1000 for name in written)


def test_the_verifiers_example_makes_its_data(tmp_path):
    [command] = [c for c in RUN_HERE if c.startswith("python -c") and "make_demo_data" in c]
    code = command.split('"')[1]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "data" / "rl.parquet").is_file()
