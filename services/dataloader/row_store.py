"""Checked rows of one source on disk, readable by position: shuffling without holding the data.

A shuffled epoch visits rows in any order, which parquet cannot serve cheaply (a row costs
decoding its whole row group). So when a source is opened, its checked rows are written once,
one JSON record after another, to a file in the cache directory, and only the offsets (8 bytes
a row) stay in memory. `get(i)` is then one positional read.
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import numpy as np


class RowStore:
    """Append records while opening, then `seal()` and read them by position (thread-safe reads)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._writer = open(self.path, "wb")  # closed by seal() or close()
        self._offsets: array | np.ndarray = array("q", [0])
        self._fd: int | None = None

    def append(self, record: bytes) -> None:
        self._writer.write(record)
        self._offsets.append(self._offsets[-1] + len(record))

    def seal(self) -> None:
        """Finish writing; from now on the store is read-only."""
        self._writer.close()
        self._offsets = np.frombuffer(self._offsets, dtype=np.int64)
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, position: int) -> bytes:
        """The record at `position` (0 <= position < len)."""
        assert self._fd is not None, "RowStore.get before seal()"
        start, end = int(self._offsets[position]), int(self._offsets[position + 1])
        return os.pread(self._fd, end - start, start)

    def close(self) -> None:
        """Close and delete the file."""
        if not self._writer.closed:
            self._writer.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.path.unlink(missing_ok=True)
