"""Start rollway services as real processes for tests (see rollway.common.supervision.service_process),
and look at process trees through /proc (Linux): what a launcher started, and whether it is still
running."""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from rollway.common.supervision.service_process import ServiceProcess
from rollway.deploy.chaos import descendants

__all__ = ["ServiceProcess", "alive", "descendants", "read_until", "start_together", "wait_all_gone"]


def start_together(stack: ExitStack, services: dict[str, ServiceProcess]) -> dict[str, ServiceProcess]:
    """Start the services at once, as the launcher does (their imports overlap: a trainer alone
    takes ~5 s), and wait for every health check; each is stopped when `stack` closes, whether
    its start succeeded or not. The first start that failed is raised after all were awaited."""
    for service in services.values():
        stack.push(service)  # its __exit__ stops it (a no-op for one that never started)
    with ThreadPoolExecutor(max(len(services), 1)) as pool:
        futures = [pool.submit(service.start) for service in services.values()]
    errors = [future.exception() for future in futures if future.exception() is not None]
    if errors:
        raise errors[0]
    return services


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def descendants_running(ancestor: int, module: str) -> list[int]:
    """The pids below `ancestor` running `python -m <module>` (e.g. a run's environment process)."""
    pids = []
    for pid in descendants(ancestor):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue  # exited meanwhile
        if module.encode() in cmdline:
            pids.append(pid)
    return pids


def wait_all_gone(pids, timeout: float) -> list[int]:
    """Poll until none of `pids` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return []
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def read_until(proc: subprocess.Popen, marker: str, timeout: float = 180.0) -> list[str]:
    """Lines of `proc`'s output up to one starting with `marker`; the rest keeps being read (so
    the pipe never fills). Past `timeout` the process is killed and the test fails with its output."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(marker):
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(timeout):
        proc.kill()
        raise AssertionError(f"no {marker!r} within {timeout:.0f}s:\n{''.join(lines)}")
    return lines
