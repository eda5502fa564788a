"""Start rollway services as real processes on loopback ports and stop them by pid.

    with ServiceProcess("dataloader", ["--prompt-data", path], tmp_path) as svc:
        stub = DataloaderServiceStub(open_channel(svc.address))

The service binds port 0 and writes the bound port to a file (no port races between tests).
Stopping sends SIGTERM to the service's own pid and waits; SIGKILL only if it does not drain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rollway.common.client import ClientConfig, wait_until_serving


class ServiceProcess:
    """A `python -m rollway.<service>` child process with its log captured to a file."""

    def __init__(self, service: str, args: list[str], workdir: Path, *, env: dict[str, str] | None = None,
                 wait_serving: bool = True, startup_timeout: float = 120.0, client_config: ClientConfig | None = None):
        self.service = service
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port_file = self.workdir / f"{service}-{os.getpid()}-{time.monotonic_ns()}.port"
        self.log_path = self.port_file.with_suffix(".log")
        self.args = args
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.wait_serving = wait_serving
        self.startup_timeout = startup_timeout
        self.client_config = client_config
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ServiceProcess:
        cmd = [sys.executable, "-m", f"rollway.{self.service}", "--port", "0", "--port-file", str(self.port_file),
               "--log-format", "json", *self.args]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + self.startup_timeout
        while not self.port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.service} exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.service} did not bind within {self.startup_timeout}s:\n{self.log_text()[-4000:]}")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())
        if self.wait_serving:
            try:
                wait_until_serving(self.address, max(deadline - time.monotonic(), 1.0), self.client_config)
            except TimeoutError:
                log = self.log_text()[-4000:]
                self.stop()
                raise TimeoutError(f"{self.service} never became SERVING:\n{log}") from None
        return self

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def signal(self, signum: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the process by pid, wait for the drain, SIGKILL if it hangs. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
