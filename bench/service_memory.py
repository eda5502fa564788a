"""Peak resident memory of each service of a local `rollway run`, read from /proc while it runs.

    with ServiceMemory(os.getpid()) as memory:    # every service below this process
        run_with_chaos(...)
    memory.peak_bytes()    {"trainer": 7.1e9, "rollout": 2.9e9, "dataloader": 3.1e8, "coordinator": ...}

A service's figure is the kernel's high-water mark of resident memory (VmHWM) of its process plus
those of the processes below it that are not services themselves (the trainer's ranks 1..N-1, an
engine's helpers): the coordinator is the parent of the other services, so their memory is never
counted in its figure. The high-water mark is kept by the kernel, so polling misses no short
spike; only what a process reaches after the last poll before it exits is lost (a fraction of a
second). A service replaced after a crash is a new process tree: the figure is the largest of its
trees, not their sum.
"""

from __future__ import annotations

import threading
from pathlib import Path

from rollway.deploy.chaos import SERVICES, descendants

POLL_SECONDS = 0.25


def high_water_bytes(pid: int) -> int:
    """VmHWM of `pid` in bytes (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def service_of(command_line: str) -> str | None:
    """The service a process runs (`python -m rollway.<service> ...`), or None."""
    for service in SERVICES:
        if f"-m rollway.{service} " in command_line + " ":
            return service
    return None


class ServiceMemory(threading.Thread):
    """Polls the services below `root_pid` until stopped; see the module docstring."""

    def __init__(self, root_pid: int):
        super().__init__(daemon=True, name="service-memory")
        self.root_pid = root_pid
        self.tree_peaks: dict[int, tuple[str, int]] = {}  # service root pid -> (service, bytes)
        self._stopping = threading.Event()

    def __enter__(self) -> ServiceMemory:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        self.join(5)

    def run(self) -> None:
        while not self._stopping.wait(POLL_SECONDS):
            self.poll()

    def poll(self) -> None:
        processes = descendants(self.root_pid)
        roots = {pid: service_of(cmd) for pid, cmd in processes.items()}
        for pid, service in roots.items():
            if service is None:
                continue
            below = [p for p in descendants(pid) if roots.get(p) is None]
            total = high_water_bytes(pid) + sum(high_water_bytes(p) for p in below)
            _, seen = self.tree_peaks.get(pid, (service, 0))
            self.tree_peaks[pid] = (service, max(seen, total))

    def peak_bytes(self) -> dict[str, int]:
        """Per service, the largest peak of any of its process trees."""
        peaks: dict[str, int] = {}
        for service, peak in self.tree_peaks.values():
            peaks[service] = max(peaks.get(service, 0), peak)
        return peaks
