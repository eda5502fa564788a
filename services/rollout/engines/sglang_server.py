"""Launching and supervising `python -m sglang.launch_server` processes.

    Supervisor thread, every --sglang-health-interval seconds, for each server:
        process exited            -> restart it (up to --sglang-max-restarts), wait for health
        3 failed health checks    -> stop it (its process group), restart it
    Requests only go to servers marked healthy.

Each server runs in its own process group (start_new_session) so that stopping it also stops
the scheduler and detokenizer processes SGLang forks; the group is signalled by the id of the
process we started. A restarted server serves the checkpoint's weights: `on_restart` runs
before it is launched again, so the engine can hold it out of generation until the current
weights are pushed to it (sglang.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rollway.common.log import get_logger
from rollway.rollout.engines.base import EngineError
from rollway.rollout.engines.sglang_http import SGLangClient

log = get_logger("rollway.rollout.sglang")

MAX_FAILED_CHECKS = 3


GUARD = Path(__file__).with_name("sglang_guard.py")


def launch_command(config, index: int, port: int) -> list[str]:
    """The launch_server command of server `index` (GPUs index*tp .. index*tp+tp-1), run under
    sglang_guard.py so that the server ends with this process (see there)."""
    tp = config.rollout_num_gpus_per_engine
    python = config.sglang_python or sys.executable
    command = [
        python, str(GUARD), str(os.getpid()), "--",
        python, "-m", "sglang.launch_server",
        "--model-path", config.hf_checkpoint,
        "--tp-size", str(tp),
        # On a CPU SGLang reads the GPU id as a NUMA node: every server takes node 0.
        "--base-gpu-id", str(0 if _on_cpu(config) else index * tp),
        "--mem-fraction-static", str(config.sglang_mem_fraction_static),
        "--dtype", config.dtype,
        "--host", config.sglang_host,
        "--port", str(port),
    ]  # fmt: skip
    if config.sglang_enable_memory_saver:
        command.append("--enable-memory-saver")
    return command + list(config.sglang_extra_args)


def _on_cpu(config) -> bool:
    args = list(config.sglang_extra_args)
    return any(a == "--device" and args[i + 1 : i + 2] == ["cpu"] for i, a in enumerate(args)) or (
        "--device=cpu" in args
    )


def launch_env(config) -> dict[str, str]:
    """This process's environment with the run's `sglang_env` entries (KEY=VALUE) over it."""
    env = os.environ.copy()
    env.update(entry.split("=", 1) for entry in config.sglang_env)
    return env


class ServerProcess:
    """One supervised server: its command, process, log file and HTTP client."""

    def __init__(
        self,
        command: list[str] | None,
        url: str,
        log_path: Path | None,
        request_timeout: float,
        env: dict[str, str] | None = None,
    ):
        self.command = command
        self.url = url
        self.log_path = log_path
        self.env = env
        self.client = SGLangClient(url, request_timeout)
        self.proc: subprocess.Popen | None = None
        self.healthy = False
        self.restarted = False
        self.num_restarts = 0
        self.failed_checks = 0
        # Weight state, kept by the engine: the version last loaded whole (0: the checkpoint),
        # whether the server must get the current weights before it generates again (restarted,
        # or an update failed half-way through it), and whether it has weight-update sessions
        # (None: not asked yet; SGLang 0.5.21+ has them).
        self.weight_version = 0
        self.awaiting_weights = False
        self.has_sessions: bool | None = None
        self.buckets_loaded = 0  # buckets of the update in progress that this server loaded
        # Weight calls in flight: a server inside a collective (waiting in a rendezvous for a
        # restarting peer, receiving a bucket) cannot answer health checks, and is not hung.
        self.weight_calls = 0

    @property
    def launched(self) -> bool:
        return self.command is not None

    def launch(self) -> None:
        assert self.command is not None and self.log_path is not None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env if self.env is not None else os.environ.copy(),
            )
        log.info("sglang server launched", url=self.url, pid=self.proc.pid, log=str(self.log_path))

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def log_tail(self, num_bytes: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-num_bytes:].decode(errors="replace")

    def wait_healthy(self, timeout: float) -> None:
        """Poll /health_generate until 200; EngineError if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise EngineError(
                    f"sglang server {self.url} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if self.client.healthy(timeout=min(30.0, max(deadline - time.monotonic(), 1.0))):
                self.healthy, self.failed_checks = True, 0
                return
            time.sleep(1.0)
        raise EngineError(f"sglang server {self.url} not healthy after {timeout:.0f}s:\n{self.log_tail()}")

    def terminate(self, grace: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL it if it does not exit within `grace`."""
        self.healthy = False
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


class Supervisor:
    """Starts the servers, then keeps them alive from a daemon thread."""

    def __init__(
        self,
        servers: list[ServerProcess],
        *,
        startup_timeout: float,
        interval: float,
        max_restarts: int,
        on_restart: Callable[[ServerProcess], None] | None = None,
    ):
        self.servers = servers
        self.startup_timeout = startup_timeout
        self.interval = interval
        self.max_restarts = max_restarts
        self.on_restart = on_restart
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sglang-supervisor", daemon=True)

    def start(self) -> None:
        for server in self.servers:
            if server.launched:
                server.launch()
        for server in self.servers:
            server.wait_healthy(self.startup_timeout)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for server in self.servers:
            if server.launched:
                server.terminate()

    def check_once(self) -> None:
        """One supervision round (the thread calls this every interval)."""
        for server in self.servers:
            if self._stop.is_set():
                return
            if server.alive() and server.weight_calls > 0:
                continue
            if server.alive() and server.client.healthy(timeout=min(30.0, self.interval * 3)):
                server.healthy, server.failed_checks = True, 0
                continue
            server.failed_checks += 1
            server.healthy = False
            if server.launched and (not server.alive() or server.failed_checks >= MAX_FAILED_CHECKS):
                self._restart(server)

    def _restart(self, server: ServerProcess) -> None:
        if server.num_restarts >= self.max_restarts:
            log.error("sglang server down for good", url=server.url, restarts=server.num_restarts)
            return
        log.warning(
            "restarting sglang server", url=server.url, exit_code=server.proc.poll() if server.proc else None
        )
        server.terminate()
        server.num_restarts += 1
        server.restarted = True
        if self.on_restart is not None:
            self.on_restart(server)  # before it can answer: it must not serve the checkpoint's weights
        server.launch()
        try:
            server.wait_healthy(self.startup_timeout)
        except EngineError as exc:
            log.error("sglang server restart failed", url=server.url, error=str(exc)[:500])

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception:
                log.exception("sglang supervision round failed")
