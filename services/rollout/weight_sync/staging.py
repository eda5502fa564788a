"""The staging buffers a distributed update lands in, apart from the weights being served.

Two sets: after a verified update the engine swaps its parameters onto views of the set just
received (no copy), and the other set receives the next update. Memory: two copies of the
weights, as with a separate staging copy.
"""

from __future__ import annotations

import torch

from rollway.common.weight_sync.buckets import Bucket


class StagingPool:
    """Two sets of bucket buffers; the `live` one may back the served weights after a swap."""

    def __init__(self) -> None:
        self._sets: list[list[torch.Tensor]] = []
        self.live: int | None = None

    def take(self, buckets: list[Bucket], device: torch.device) -> tuple[int, list[torch.Tensor]]:
        """A set of buffers for `buckets` (reused when the layout repeats) that the served model does not use."""
        sizes = [b.padded_size for b in buckets]
        for i, buffers in enumerate(self._sets):
            if i != self.live and [b.numel() for b in buffers] == sizes and buffers[0].device == device:
                return i, buffers
        spare = [i for i in range(len(self._sets)) if i != self.live]
        fresh = [torch.empty(size, dtype=torch.uint8, device=device) for size in sizes]
        if len(self._sets) < 2:
            self._sets.append(fresh)
            return len(self._sets) - 1, fresh
        self._sets[spare[0]] = []  # drop the old set before the new one counts
        self._sets[spare[0]] = fresh
        return spare[0], fresh

    def clear(self) -> None:
        """Free every buffer (ReleaseMemory: the engine's weights are gone as well)."""
        self._sets, self.live = [], None
