"""`rollway up`: start the four services as local processes on loopback ports, check they are
healthy, and stop them (or hold them until Ctrl-C). Each is a ServiceProcess
(rollway.common.supervision.service_process).

The model and data come from `prepare_assets` (the CLI passes the demo's tiny model and data,
rollway.demo.data.ensure_demo_assets): launch code sits below the demo and does not import it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

from rollway.common.supervision.service_process import ServiceProcess


def main(argv: list[str] | None, prepare_assets: Callable[[Path], tuple[Path, Path]]) -> int:
    """`rollway up`: start the four services with the tiny model and demo data, check health, stop."""
    # prepare_assets(workdir) builds (or finds) them: the model directory and the data directory.
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
        model_dir, data_dir = prepare_assets(workdir)
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
