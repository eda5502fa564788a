"""A real full disk for tests: a small tmpfs (ENOSPC from the kernel, not a stand-in)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

from rollway.deploy import chaos

MIB = 1 << 20


@contextmanager
def small_disk(path: Path, size_bytes: int):
    """A tmpfs of `size_bytes` mounted at `path` (skips the test where mounting is not allowed)."""
    try:
        with chaos.small_disk(path, size_bytes) as disk:
            yield disk
    except chaos.NoSmallDisk as reason:
        pytest.skip(str(reason))
