"""Start rollway services as real processes for tests (see rollway.deploy.local_processes), and look
at process trees through /proc (Linux): what a launcher started, and whether it is still running."""

from __future__ import annotations

import time
from pathlib import Path

from rollway.deploy.chaos import descendants
from rollway.deploy.local_processes import ServiceProcess

__all__ = ["ServiceProcess", "alive", "descendants", "wait_all_gone"]


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def wait_all_gone(pids, timeout: float) -> list[int]:
    """Poll until none of `pids` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return []
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]
