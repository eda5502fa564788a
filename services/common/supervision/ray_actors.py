"""The Ray actor that hosts one rollway process on its node: a service or a trainer worker rank.

    coordinator ── ServiceHost.options(placement-group bundle).remote() ──> actor on some node
           .start_service("rollout", settings)  python -m rollway.rollout --host <node ip> --port 0 --config ...
           .start_trainer_worker(rank, ...)     python -m rollway.trainer.worker (torchrun environment)
           .wait_port() / .poll() / .stop()

The process is the actor's child: it inherits the GPUs Ray gave the actor (CUDA_VISIBLE_DEVICES)
and gets SIGKILL when the actor dies (PR_SET_PDEATHSIG), so a killed actor leaves no orphan. The
entry points and flags are those of a local run; only the placement differs. Ray is imported only
where an actor method needs it, so this module imports anywhere.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from rollway.common.rank_env import CONFIG_ENV

PR_SET_PDEATHSIG = 1
LOG_TAIL_LINES = 30


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class ServiceHost:
    """Starts, watches and stops one process on the actor's node (one per actor)."""

    def __init__(self, name: str, workdir: str, generation: int = 0):
        self.name = name
        self.workdir = Path(workdir) / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        suffix = f"-{generation}" if generation else ""  # a restarted actor keeps its predecessor's log
        self.log_path = self.workdir / f"process{suffix}.log"
        self.port_file = self.workdir / f"port{suffix}"
        # A former attempt of the same run (a rerun, `--resume`) left its port file here: it names a
        # port nothing listens on any more, and must not be read as this process's.
        self.port_file.unlink(missing_ok=True)
        self.proc: subprocess.Popen | None = None
        self._log = None

    def node(self) -> dict:
        """Where this actor runs: node ip and id, host name, the GPUs Ray gave it."""
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        }

    def free_ports(self, count: int) -> list[int]:
        """`count` distinct ports free on this node right now (held together while picked)."""
        sockets = [socket.socket() for _ in range(count)]
        try:
            for s in sockets:
                s.bind(("", 0))
            return [s.getsockname()[1] for s in sockets]
        finally:
            for s in sockets:
                s.close()

    def start_service(self, service: str, host: str, settings: dict, extra_args: list[str]) -> int:
        """Start `python -m rollway.<service>` bound to `host` with `settings` as its --config; the pid."""
        args = ["--host", host, "--port", "0", "--port-file", str(self.port_file), "--log-format", "json"]
        if settings:
            path = self.workdir / "settings.yaml"
            path.write_text(yaml.safe_dump(settings, sort_keys=True))
            args += ["--config", str(path)]
        return self._spawn([sys.executable, "-m", f"rollway.{service}", *args, *extra_args], {})

    def start_trainer_worker(self, rank: int, world_size: int, master: str, port: int, settings: dict) -> int:
        """Start trainer rank `rank` joining rank 0's store at master:port (torchrun's variables); the pid."""
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": "0",  # the actor sees only its own GPU
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(port),
            CONFIG_ENV: json.dumps(settings),
        }
        return self._spawn([sys.executable, "-m", "rollway.trainer.worker"], env)

    def _spawn(self, cmd: list[str], env: dict[str, str]) -> int:
        if self.proc is not None:
            raise RuntimeError(f"{self.name}: a process was already started (pid {self.proc.pid})")
        self._log = open(self.log_path, "w")
        # Idle OpenMP threads sleep (rollway.common.cpu_threads.PASSIVE_WAIT_ENV; this module
        # imports nothing of rollway's).
        full_env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONUNBUFFERED": "1", **env}
        full_env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, preexec_fn=_die_with_parent
        )
        return self.proc.pid

    def wait_port(self, timeout_s: float) -> int:
        """The port the service bound (from its port file); raises with the log tail if it exits first."""
        deadline = time.monotonic() + timeout_s
        while not self.port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before serving:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not bind within {timeout_s:.0f}s:\n{self.log_tail()}")
            time.sleep(0.05)
        return int(self.port_file.read_text())

    def poll(self) -> dict | None:
        """None while the process runs; else its pid, exit code and last log lines."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return {"pid": self.proc.pid, "code": self.proc.returncode, "log_tail": self.log_tail()}

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the process at once (a hung service: a frozen one ignores SIGTERM)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the process by pid, wait for its drain, SIGKILL if it hangs; its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
        return self.proc.returncode
