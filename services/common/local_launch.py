"""Run rollway services as local child processes on loopback ports, stopped by their own pid.

    with ServiceProcess("dataloader", ["--prompt-data", path], workdir) as svc:
        stub = DataloaderServiceStub(open_channel(svc.address))

A service binds port 0 and writes the bound port to a file, so there are no port races. Stopping
sends SIGTERM to the service's own pid and waits for its drain; SIGKILL only if it hangs. Used by
`rollway up`, the embedded launcher and the tests.
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
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + self.startup_timeout
        while not self.port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.service} exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"{self.service} did not bind within {self.startup_timeout}s:\n{self.log_text()[-4000:]}"
                )
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
        return self if self.proc is not None else self.start()  # `with svc.start():` starts it once

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """`rollway up`: start the four services with the tiny model and demo data, check health, stop."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="rollway up", description=main.__doc__)
    parser.add_argument("--workdir", help="where the model, data and service logs go (default: a temp dir)")
    parser.add_argument("--hold", action="store_true", help="keep the services running until Ctrl-C")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rollway-up-"))
    model_dir, data = _ensure_demo_assets(workdir)
    specs = {
        "dataloader": [
            "--hf-checkpoint",
            str(model_dir),
            "--prompt-data",
            str(data["rl"]),
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
    services: list[ServiceProcess] = []
    try:
        for name, service_args in specs.items():
            services.append(ServiceProcess(name, service_args, workdir / "logs").start())
            print(
                f"{name:<12} SERVING  {services[-1].address}  pid {services[-1].pid}  log {services[-1].log_path}"
            )
        if args.hold:
            print("all four services are up; Ctrl-C stops them")
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        else:
            print("all four services are up and healthy; stopping them")
        return 0
    finally:
        for service in reversed(services):
            code = service.stop()
            print(f"{service.service:<12} stopped (exit {code})")


def demo_service_args(model_dir: Path, data_dir: Path, workdir: Path) -> dict[str, list[str]]:
    """Flags that start each service on the tiny model and the demo's RL prompts."""
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
    from rollway.common.demo_data import make_demo_data
    from rollway.common.tiny_model import make_tiny_model

    model_dir = workdir / "tiny-model"
    if not (model_dir / "config.json").exists():
        make_tiny_model(model_dir, seed=0)
    make_demo_data(workdir / "data", seed=0)
    return model_dir, workdir / "data"
