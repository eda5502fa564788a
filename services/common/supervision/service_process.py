"""Run rollway services as local child processes on loopback ports, stopped by their own pid.

    with ServiceProcess("dataloader", ["--prompt-data", path], workdir) as svc:
        stub = DataloaderServiceStub(open_channel(svc.address))

A service binds port 0 and writes the bound port to a file, so there are no port races. Start-up
fails at once, with the log tail, if the process exits before it is SERVING. Stopping sends
SIGTERM to the service's own pid and waits for its drain; SIGKILL (to its process group) only if
it hangs. Each service runs in a process group of its own, so whatever it starts is stopped with
it, and it watches this process (parent_watch): if the launcher dies, even by SIGKILL, the
service drains and exits within seconds. Used by the run-time supervisor (supervisor.py), by
`rollway up`, the demos and the tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rollway.common.client import ClientConfig, wait_until_serving
from rollway.common.cpu_threads import PASSIVE_WAIT_ENV
from rollway.common.parent_watch import child_env

LOG_TAIL_CHARS = 4000


class ServiceExitedError(RuntimeError):
    """A service process exited while it was starting."""


class ServiceProcess:
    """A `python -m rollway.<service>` child process with its log captured to a file."""

    def __init__(
        self,
        service: str,
        args: list[str],
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        wait_serving: bool = True,
        startup_timeout: float = 120.0,
        client_config: ClientConfig | None = None,
        module: str | None = None,
    ):
        self.service = service
        self.module = module or f"rollway.{service}"
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port_file = self.workdir / f"{service}-{os.getpid()}-{time.monotonic_ns()}.port"
        self.log_path = self.port_file.with_suffix(".log")
        self.args = args
        # One OpenMP thread unless a service sets its own count (the trainer and the CPU rollout
        # engine do: common/cpu_threads.py), and idle threads sleep rather than spin.
        self.env = {
            **PASSIVE_WAIT_ENV,
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.wait_serving = wait_serving
        self.startup_timeout = startup_timeout
        self.client_config = client_config
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._reaped_lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ServiceProcess:
        cmd = [
            sys.executable,
            "-m",
            self.module,
            "--port",
            "0",
            "--port-file",
            str(self.port_file),
            "--log-format",
            "json",
            *self.args,
        ]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=child_env(self.env),  # ROLLWAY_PARENT_PID: the service exits when this process dies
            process_group=0,  # its own group: stop() can end whatever the service started, too
        )
        deadline = time.monotonic() + self.startup_timeout
        try:
            while not self.port_file.exists():
                self._raise_if_exited()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.service} (pid {self.pid}) did not bind within {self.startup_timeout:.0f}s; "
                        f"last log lines:\n{self._tail()}"
                    )
                time.sleep(0.05)
            self.port = int(self.port_file.read_text())
            if self.wait_serving:
                remaining = max(deadline - time.monotonic(), 1.0)
                try:
                    # The port is ours and the process is watched (check): a refused connection while it
                    # loads (a busy machine can take long before the server starts) is not "unreachable";
                    # its exit or startup_timeout ends the wait.
                    wait_until_serving(
                        self.address,
                        remaining,
                        self.client_config,
                        unreachable_seconds=remaining,
                        check=self._raise_if_exited,
                    )
                except TimeoutError as exc:
                    raise TimeoutError(
                        f"{self.service} (pid {self.pid}) never became SERVING ({exc}); "
                        f"last log lines:\n{self._tail()}"
                    ) from None
        except BaseException:
            self.stop()
            raise
        return self

    def _raise_if_exited(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServiceExitedError(
                f"{self.service} (pid {self.pid}) exited with {self.proc.returncode} during start-up; "
                f"last log lines:\n{self._tail()}"
            )

    def _tail(self) -> str:
        return self.log_text()[-LOG_TAIL_CHARS:]

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def signal(self, signum: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the process by pid, wait for the drain, SIGKILL if it hangs. Returns the exit code.

        Whatever else is left in the service's process group is then killed too, while the
        service's unreaped exit status still reserves the group id (no stray kill)."""
        if self.proc is None:
            return None
        with self._reaped_lock:
            if self.proc.returncode is None:
                if not self._exited_unreaped(0):
                    self.proc.send_signal(signal.SIGTERM)
                    self.proc.send_signal(signal.SIGCONT)  # a stopped process acts on it only then
                    if not self._exited_unreaped(timeout):
                        self._kill_group()
                        self._exited_unreaped(10.0)
                self._kill_group()  # the service's own children, should any have outlived it
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the service and its process group at once (a hung one: SIGTERM would wait)."""
        with self._reaped_lock:
            self._kill_group()

    def _exited_unreaped(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the process to exit, leaving it unreaped (a zombie keeps its pid)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                    return True
            except ChildProcessError:  # reaped elsewhere (Popen.poll); returncode is set
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _kill_group(self) -> None:
        if self.proc is not None and self.proc.returncode is None:  # not reaped: the group id is still ours
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def __enter__(self) -> ServiceProcess:
        return self if self.proc is not None else self.start()  # `with svc.start():` starts it once

    def __exit__(self, *exc) -> None:
        self.stop()
