"""A real full disk for tests: a small tmpfs (ENOSPC from the kernel, not a stand-in)."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

MIB = 1 << 20


@contextmanager
def small_disk(path: Path, size_bytes: int):
    """A tmpfs of `size_bytes` mounted at `path` (skips the test where mounting is not allowed)."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount, which needs root")
    path.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
