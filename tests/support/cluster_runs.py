"""`rollway run --launcher ray` on a NetnsCluster, as the cluster tests drive and read it.

run = ClusterRun.start(cluster, tmp_path, grpo_settings(model, data, tmp_path, "ref"))
run.wait_steps(2)                      # metrics.jsonl has steps 0 and 1
fault = run.fault_now()                # the moment of a fault, and the steps logged then
run.next_step_seconds(fault)           # seconds from the fault to the next step logged
run.wait_end()                         # the launcher's exit code
run.placement()["trainer-0"]["node"]   # RUN_DIR/services/ray.json
run.weights_digest()                   # sha256 of the final HF export's safetensors
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from support.processes import descendants

REWARD_MODULE = '''
def odd_index(sample):
    """Half of every group scores 1: every group has reward variance, so GRPO has a gradient."""
    return float(sample.index % 2)
'''

RUN_TIMEOUT_S = 300.0
POLL_S = 0.05
TIMINGS: list[str] = []  # printed at the end of the session (conftest), for the figures of each fault


def report(line: str) -> None:
    TIMINGS.append(line)
    print(line, flush=True)


def grpo_settings(model: Path, data: Path, workdir: Path, run_id: str, **extra) -> dict:
    """A tiny GRPO run that checkpoints every step and exports its final weights (save_hf)."""
    return {
        "run_id": run_id,
        "run_dir": str(workdir / "runs"),
        "hf_checkpoint": str(model),
        "prompt_data": [str(data / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "global_batch_size": 16,
        "rollout_max_response_len": 6,
        "loss_type": "policy_loss",
        "advantage_estimator": "grpo",
        "rm_type": "custom",
        "custom_rm_path": "cluster_reward:odd_index",
        "lr": 1e-3,
        "num_rollout": 12,
        "save": str(workdir / "save" / run_id),
        "save_interval": 1,
        "save_hf": str(workdir / "hf" / run_id),
        "max_restarts": 8,
        "restart_backoff_seconds": 0.1,
        **extra,
    }


def sft_settings(model: Path, data: Path, workdir: Path, run_id: str, **extra) -> dict:
    """A tiny SFT run on two trainer ranks that checkpoints every step and exports its weights."""
    return {
        "run_id": run_id,
        "run_dir": str(workdir / "runs"),
        "hf_checkpoint": str(model),
        "loss_type": "sft_loss",
        "prompt_data": [str(data / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "num_rollout": 6,
        "rollout_batch_size": 16,
        "global_batch_size": 16,
        "lr": 3e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        "world_size": 2,
        "save": str(workdir / "save" / run_id),
        "save_interval": 1,
        "save_hf": str(workdir / "hf" / run_id),
        "max_restarts": 8,
        "restart_backoff_seconds": 0.1,
        **extra,
    }


@dataclass
class Fault:
    """When a fault began and the highest step logged then."""

    started: float
    last_step: int


class ClusterRun:
    """One `rollway run` launcher process inside the head's namespace."""

    def __init__(self, cluster, config: Path, run_dir: Path, log_path: Path, process: subprocess.Popen):
        self.cluster, self.config, self.run_dir, self.log_path = cluster, config, run_dir, log_path
        self.process = process

    @classmethod
    def start(cls, cluster, workdir: Path, settings: dict, *flags: str) -> ClusterRun:
        config = workdir / f"{settings['run_id']}.yaml"
        config.write_text(yaml.safe_dump(settings))
        return cls.launch(cluster, config, Path(settings["run_dir"]) / settings["run_id"], *flags)

    @classmethod
    def launch(cls, cluster, config: Path, run_dir: Path, *flags: str) -> ClusterRun:
        log_path = config.with_suffix(f".{int(time.time() * 1000)}.log")
        argv = [sys.executable, "-m", "rollway.cli", "run", str(config), "--launcher", "ray",
                "--ray-address", cluster.ray_address, *flags]  # fmt: skip
        with log_path.open("w") as log:
            process = cluster.run_in(0, argv, stdout=log, stderr=subprocess.STDOUT)
        return cls(cluster, config, run_dir, log_path, process)

    # --- reading the run directory ---
    def records(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]  # a line being written is left out

    def steps(self) -> list[int]:
        return [r["step"] for r in self.records() if "step" in r]

    def last_step(self) -> int:
        return max(self.steps(), default=-1)

    def placement(self) -> dict[str, dict]:
        """ray.json's actors: {name: {node, address, pid, generation, ...}}."""
        return json.loads((self.run_dir / "services" / "ray.json").read_text())["actors"]

    def status(self) -> dict:
        return json.loads((self.run_dir / "status.json").read_text())

    def result(self) -> dict:
        return json.loads((self.run_dir / "result.json").read_text())

    def weights_digest(self) -> str:
        export = Path(self.result()["hf_export_dir"])
        return hashlib.sha256((export / "model.safetensors").read_bytes()).hexdigest()

    def describe(self) -> str:
        """What the run directory says of its end, restarts and actors (for assertion messages)."""
        parts = []
        for name in ("status.json", "result.json", "services/ray.json"):
            path = self.run_dir / name
            if path.exists():
                text = path.read_text()
                if name == "result.json":
                    result = json.loads(text)
                    text = json.dumps({k: result[k] for k in ("num_restarts", "recoveries") if k in result})
                parts.append(f"{name}: {text[:3000]}")
        return "\n".join(parts)

    def log_tail(self, num_chars: int = 4000) -> str:
        return self.log_path.read_text()[-num_chars:] if self.log_path.exists() else ""

    # --- holding ---
    def freeze(self) -> None:
        """SIGSTOP the launcher and its coordinator (by pid): the run stays at the step it reached
        while the test sets up its next fault, however fast the machine runs the steps."""
        self._frozen = [self.process.pid, *descendants(self.process.pid)]
        for pid in self._frozen:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in getattr(self, "_frozen", []):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._frozen = []

    # --- waiting ---
    def wait_for(self, condition, timeout: float, what: str) -> None:
        """Poll until `condition()`; fail naming `what` (with the launcher's log) at the deadline or if
        the launcher exits first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None and not condition():
                raise AssertionError(
                    f"the run exited with {self.process.returncode} while waiting for {what}:\n{self.log_tail()}\n"
                    f"{self.describe()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.log_tail()}")
            time.sleep(POLL_S)

    def wait_steps(self, num_steps: int, timeout: float = RUN_TIMEOUT_S) -> None:
        self.wait_for(lambda: self.last_step() >= num_steps - 1, timeout, f"step {num_steps - 1} logged")

    def fault_now(self) -> Fault:
        return Fault(time.monotonic(), self.last_step())

    def next_step_seconds(self, fault: Fault, timeout: float = RUN_TIMEOUT_S) -> float:
        """Seconds from the fault until a step after the ones logged then is logged."""
        self.wait_for(lambda: self.last_step() > fault.last_step, timeout, f"a step after {fault.last_step}")
        return time.monotonic() - fault.started

    def wait_restarted(self, actor: str, generation: int, timeout: float = RUN_TIMEOUT_S) -> None:
        """Until ray.json shows `actor` at `generation` (its restarts so far)."""
        self.wait_for(
            lambda: self.placement()[actor]["generation"] >= generation,
            timeout,
            f"{actor}'s restart {generation}",
        )

    def wait_end(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the run did not end within {timeout:.0f}s:\n{self.log_tail()}") from None

    def stop(self) -> None:
        """SIGKILL the launcher (by pid): its driver's actors die with it."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
