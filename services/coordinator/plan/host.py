"""What this machine has for a run, read without torch: its memory, a GPU, and which of the run's
services start here."""

from __future__ import annotations

from pathlib import Path


def available_memory() -> int:
    """Bytes of memory this machine can give a run now (MemAvailable; Linux), or 0 if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def gpu_present() -> bool:
    """A CUDA GPU on this machine, seen without importing torch (the NVIDIA driver's /proc entry)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def services_started_here(configs: dict[str, object]) -> list[str]:
    """The services a local run starts on this machine: those it uses and gives no address for
    (launcher ray places them on its cluster: none here)."""
    from rollway.coordinator.run_config import RunConfig

    if configs["coordinator"].launcher != "local":
        return []
    run = RunConfig(**configs, given={})
    addresses = run.addresses()
    return [name for name in run.services_used() if not addresses.get(name)]
