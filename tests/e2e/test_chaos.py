"""Self-healing runs: a seeded harness kill -9s every service during a short GRPO run under
`rollway run`; the run completes on its own, every prompt is used once, metrics.jsonl holds each
step once, and the final weights equal an uninterrupted run's bit for bit."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.processes import descendants

from rollway.coordinator.prompt_ledger import PromptLedger

pytestmark = pytest.mark.slow

NUM_STEPS = 10
RUN_SECONDS = 420.0
REWARD = '''
def digit_share(sample):
    """Share of digits among a response's non-space characters: varies between samples."""
    text = "".join(sample.response.split())
    return sum(c.isdigit() for c in text) / max(len(text), 1)
'''


def write_config(path: Path, model: Path, data: Path, run_dir: Path, save: Path, export: Path) -> Path:
    config = {
        "hf_checkpoint": str(model),
        "prompt_data": [str(data / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "global_batch_size": 16,
        "num_rollout": NUM_STEPS,
        "rollout_max_response_len": 6,
        "lr": 3e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        "reward": "custom",
        "custom_rm_path": "chaos_reward:digit_share",
        "save": str(save),
        "save_interval": 1,
        "save_hf": str(export),
        "run_dir": str(run_dir),
        "run_id": "chaos",
        "max_restarts": 8,
        "restart_backoff_seconds": 0.1,
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def launch(config: Path, reward_dir: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{reward_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-m", "rollway.cli", "run", str(config)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return len({json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()})


def service_pid(launcher: subprocess.Popen, service: str) -> int | None:
    for pid, cmd in descendants(launcher.pid).items():
        if f"-m rollway.{service} " in cmd + " ":
            return pid
    return None


class ChaosHarness(threading.Thread):
    """Kills each scheduled service once the run has logged `after_step` steps, after a seeded
    random delay inside the next step (generation, training, weight sync or checkpointing)."""

    def __init__(self, launcher: subprocess.Popen, run_dir: Path, schedule: list[tuple[int, str]], seed: int):
        super().__init__(daemon=True)
        self.launcher, self.run_dir, self.schedule = launcher, run_dir, schedule
        self.random = random.Random(seed)
        self.kills: list[tuple[str, int, int]] = []  # (service, pid, steps logged when killed)
        self.error: str | None = None

    def run(self) -> None:
        deadline = time.monotonic() + RUN_SECONDS
        for after_step, service in self.schedule:
            while steps_logged(self.run_dir) < after_step or service_pid(self.launcher, service) is None:
                if self.launcher.poll() is not None or time.monotonic() > deadline:
                    self.error = f"the run ended before {service} could be killed after step {after_step}"
                    return
                time.sleep(0.05)
            time.sleep(self.random.uniform(0.0, 0.6))  # the injected moment: somewhere in the next step
            pid = service_pid(self.launcher, service)
            if pid is None:
                continue
            os.kill(pid, signal.SIGKILL)
            self.kills.append((service, pid, steps_logged(self.run_dir)))
            # Wait for its replacement before the next kill: one failure at a time.
            while service_pid(self.launcher, service) in (None, pid):
                if self.launcher.poll() is not None or time.monotonic() > deadline:
                    return
                time.sleep(0.05)


def run_to_end(tmp_path: Path, name: str, model: Path, data: Path, schedule=(), seed: int = 0):
    workdir = tmp_path / name
    workdir.mkdir()
    (workdir / "chaos_reward.py").write_text(REWARD)
    run_dir = workdir / "runs"
    config = write_config(workdir / "run.json", model, data, run_dir, workdir / "save", workdir / "hf")
    launcher = launch(config, workdir, workdir / "launcher.log")
    harness = ChaosHarness(launcher, run_dir / "chaos", list(schedule), seed)
    harness.start()
    try:
        code = launcher.wait(RUN_SECONDS)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    harness.join(10)
    return code, harness, run_dir / "chaos", workdir


def test_a_run_survives_kill_9_of_every_service_with_nothing_lost_or_repeated(
    tmp_path, tiny_model_dir, demo_data_dir
):
    code, _, straight_dir, straight = run_to_end(tmp_path, "straight", tiny_model_dir, demo_data_dir)
    assert code == 0, (straight / "launcher.log").read_text()[-3000:]
    schedule = [(1, "trainer"), (3, "rollout"), (5, "dataloader"), (7, "coordinator")]
    code, harness, chaos_dir, chaos = run_to_end(
        tmp_path, "chaos", tiny_model_dir, demo_data_dir, schedule, seed=1234
    )
    log = (chaos / "launcher.log").read_text()
    assert code == 0, log[-3000:]
    assert harness.error is None, harness.error
    assert [service for service, _, _ in harness.kills] == ["trainer", "rollout", "dataloader", "coordinator"]
    assert "restarting the coordinator (1/8)" in log

    # Each step once in metrics.jsonl, with the uninterrupted run's values.
    records = [json.loads(line) for line in (chaos_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "train/grad_norm" in r]
    assert steps == list(range(NUM_STEPS))
    straight_records = [
        json.loads(line) for line in (straight_dir / "metrics.jsonl").read_text().splitlines()
    ]
    for key in ("rollout/raw_reward", "train/pg_loss", "train/grad_norm"):
        assert [r[key] for r in records if key in r] == [r[key] for r in straight_records if key in r], key
    assert any(r.get("fault/num_restarts", 0) >= 1 for r in records)  # recoveries are counted

    # Every prompt once, in the uninterrupted run's order.
    used = PromptLedger.by_step(chaos_dir)
    assert sorted(used) == list(range(NUM_STEPS))
    positions = [p for step in sorted(used) for p in used[step]]
    assert len(positions) == len(set(positions)) == NUM_STEPS * 4
    assert used == PromptLedger.by_step(straight_dir)

    # The final weights, bit for bit.
    exports = [
        Path(json.loads((d / "result.json").read_text())["hf_export_dir"]) for d in (chaos_dir, straight_dir)
    ]
    assert exports[0] != exports[1]
    assert (exports[0] / "model.safetensors").read_bytes() == (exports[1] / "model.safetensors").read_bytes()
