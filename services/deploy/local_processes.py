"""Run rollway services as local child processes on loopback ports, stopped by their own pid.

    with ServiceProcess("dataloader", ["--prompt-data", path], workdir) as svc:
        stub = DataloaderServiceStub(open_channel(svc.address))

A service binds port 0 and writes the bound port to a file, so there are no port races. Start-up
fails at once, with the log tail, if the process exits before it is SERVING. Stopping sends
SIGTERM to the service's own pid and waits for its drain; SIGKILL (to its process group) only if
it hangs. Each service runs in a process group of its own, so whatever it starts is stopped with
it, and it watches this process (parent_watch): if the launcher dies, even by SIGKILL, the
service drains and exits within seconds. Used by `rollway up`, the embedded launcher and the
tests.
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


def main(argv: list[str] | None = None) -> int:
    """`rollway up`: start the four services with the tiny model and demo data, check health, stop."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="rollway up", description=main.__doc__)
    parser.add_argument("--workdir", help="where the model, data and service logs go (default: a temp dir)")
    parser.add_argument(
        "--hold", action="store_true", help="keep the services running until Ctrl-C or SIGTERM"
    )
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rollway-up-"))
    stop_requested = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda *_: stop_requested.set())
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    services: list[ServiceProcess] = []
    try:
        model_dir, data_dir = _ensure_demo_assets(workdir)
        for name, service_args in demo_service_args(model_dir, data_dir, workdir).items():
            if stop_requested.is_set():
                print("stopping (signal) before every service was up", flush=True)
                return 1
            services.append(ServiceProcess(name, service_args, workdir / "logs").start())
            svc = services[-1]
            print(f"{name:<12} SERVING  {svc.address}  pid {svc.pid}  log {svc.log_path}", flush=True)
        if args.hold:
            print("all four services are up; Ctrl-C or SIGTERM stops them", flush=True)
            while not stop_requested.wait(1.0):
                dead = [s for s in services if s.proc is not None and s.proc.poll() is not None]
                if dead:
                    print(f"{dead[0].service} exited with {dead[0].proc.returncode}; stopping", flush=True)
                    return 1
        else:
            print("all four services are up and healthy; stopping them", flush=True)
        return 0
    finally:
        for service in reversed(services):
            code = service.stop()
            print(f"{service.service:<12} stopped (exit {code})", flush=True)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def demo_service_args(model_dir: Path, data_dir: Path, workdir: Path | None = None) -> dict[str, list[str]]:
    """Flags that start each service on the tiny model and the demo's RL prompts (`workdir` is unused)."""
    return {
        "dataloader": [
            "--hf-checkpoint",
            str(model_dir),
            "--prompt-data",
            str(Path(data_dir) / "rl.parquet"),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--apply-chat-template",
        ],
        "rollout": ["--hf-checkpoint", str(model_dir)],
        "trainer": ["--hf-checkpoint", str(model_dir)],
        "coordinator": [],
    }


def _ensure_demo_assets(workdir: Path) -> tuple[Path, Path]:
    """The tiny model's directory and the demo data directory under `workdir` (built if missing)."""
    from rollway.common.demo_data import make_demo_data
    from rollway.common.tiny_model import make_tiny_model

    model_dir = workdir / "tiny-model"
    if not (model_dir / "config.json").exists():
        make_tiny_model(model_dir, seed=0)
    make_demo_data(workdir / "data", seed=0)
    return model_dir, workdir / "data"
