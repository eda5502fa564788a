"""The order in which rows are drawn: a pure function of (seed, epoch, cursor).

Two orders, chosen by whether sampling weights are given:

- ConcatOrder (no weights): an epoch visits every row of every source once. The sources are
  concatenated and, with shuffling, permuted together by a generator seeded with
  (seed, epoch). The cursor is (epoch, offset).
- WeightedOrder (weights): each draw picks a source with probability proportional to its
  weight, then the next row of that source's own epoch permutation (seeded with seed, source,
  source epoch); a source wraps into its next epoch on its own. Picks are stratified per block
  of 128 draws (each source gets its share of the block, rounded at random, in shuffled
  positions) from a generator seeded with (seed, block), so the observed mix is close to the
  weights over any window and the pick of draw k needs no generator state, only k. The stream
  counts an epoch per sum(rows) draws. The cursor is (draws, per-source epoch and offset).

Either way a cursor (`state()`) is a small JSON-able dict, and `restore(state)` continues the
order exactly where it was, including across epoch boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

BLOCK = 128
_CONCAT, _SOURCE, _MIX = 0, 1, 2  # generator stream tags


@dataclass(frozen=True)
class Draw:
    """One drawn row: source index, position among the source's usable rows, epoch it belongs to."""

    source: int
    position: int
    epoch: int


class _Permutations:
    """Epoch permutations (None without shuffle); only the current epoch's is kept (4 bytes a row)."""

    def __init__(self, seed: int, shuffle: bool, tag: tuple[int, ...]):
        self.seed, self.shuffle, self.tag = seed, shuffle, tag
        self._cached: tuple[int, np.ndarray] | None = None

    def get(self, epoch: int, size: int) -> np.ndarray | None:
        if not self.shuffle:
            return None
        if self._cached is None or self._cached[0] != epoch:
            rng = np.random.default_rng([self.seed, *self.tag, epoch])
            permutation = rng.permutation(size)
            self._cached = (epoch, permutation.astype(np.uint32) if size < 2**32 else permutation)
        return self._cached[1]


class ConcatOrder:
    """Every row of every source once per epoch (see the module docstring)."""

    def __init__(self, sizes: list[int], seed: int, shuffle: bool, num_epoch: int):
        self.sizes = list(sizes)
        self.bounds = np.cumsum([0, *sizes])
        self.total = int(self.bounds[-1])
        self.num_epoch = num_epoch
        self._perms = _Permutations(seed, shuffle, (_CONCAT,))
        self.epoch = self.offset = 0

    def next(self) -> Draw | None:
        """The next row, or None once num_epoch epochs are done (never, for num_epoch 0)."""
        if self.finished(self.state()):
            return None
        perm = self._perms.get(self.epoch, self.total)
        index = int(perm[self.offset]) if perm is not None else self.offset
        source = int(np.searchsorted(self.bounds, index, side="right")) - 1
        draw = Draw(source, index - int(self.bounds[source]), self.epoch)
        self.offset += 1
        if self.offset == self.total:
            self.epoch, self.offset = self.epoch + 1, 0
        return draw

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset}

    def restore(self, state: dict[str, Any]) -> None:
        epoch, offset = _int(state, "epoch"), _int(state, "offset")
        if not 0 <= offset < self.total:
            raise ValueError(f"offset {offset} is outside the epoch of {self.total} rows")
        self.epoch, self.offset = epoch, offset

    def finished(self, state: dict[str, Any]) -> bool:
        return bool(self.num_epoch) and state["epoch"] >= self.num_epoch

    def epoch_of(self, state: dict[str, Any]) -> int:
        """The stream's epoch at a cursor (completed epochs)."""
        return state["epoch"]


class WeightedOrder:
    """Sources drawn by weight, each cycling through its own epochs (see the module docstring)."""

    def __init__(self, sizes: list[int], weights: list[float], seed: int, shuffle: bool, num_epoch: int):
        if any(w > 0 and n == 0 for n, w in zip(sizes, weights, strict=True)):
            raise ValueError("a source with a positive weight has no rows")
        self.sizes = list(sizes)
        self.weights = np.asarray(weights, dtype=np.float64) / float(sum(weights))
        self.seed = seed
        self.total = sum(sizes)
        self.num_epoch = num_epoch
        self._perms = [_Permutations(seed, shuffle, (_SOURCE, s)) for s in range(len(sizes))]
        self._block: tuple[int, np.ndarray] | None = None
        self.draws = 0
        self.positions = [[0, 0] for _ in sizes]  # [epoch, offset] per source

    def pick(self, draw: int) -> int:
        """Source of the draw-th draw (a pure function of seed, weights and draw)."""
        block = draw // BLOCK
        if self._block is None or self._block[0] != block:
            self._block = (block, self._block_picks(block))
        return int(self._block[1][draw % BLOCK])

    def _block_picks(self, block: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, _MIX, block])
        exact = self.weights * BLOCK
        counts = np.floor(exact).astype(np.int64)
        remainder = BLOCK - int(counts.sum())
        if remainder:
            fractions = exact - counts
            extra = rng.choice(len(counts), size=remainder, replace=False, p=fractions / fractions.sum())
            counts[extra] += 1
        picks = np.repeat(np.arange(len(counts)), counts)
        rng.shuffle(picks)
        return picks

    def next(self) -> Draw | None:
        if self.finished(self.state()):
            return None
        source = self.pick(self.draws)
        epoch, offset = self.positions[source]
        perm = self._perms[source].get(epoch, self.sizes[source])
        position = int(perm[offset]) if perm is not None else offset
        offset += 1
        self.positions[source] = [epoch + 1, 0] if offset == self.sizes[source] else [epoch, offset]
        self.draws += 1
        return Draw(source, position, epoch)

    def state(self) -> dict[str, Any]:
        return {"draws": self.draws, "sources": [list(p) for p in self.positions]}

    def restore(self, state: dict[str, Any]) -> None:
        draws = _int(state, "draws")
        positions = state.get("sources")
        if not isinstance(positions, list) or len(positions) != len(self.sizes):
            raise ValueError(f"sources must list [epoch, offset] for each of the {len(self.sizes)} sources")
        checked = []
        for (epoch, offset), size in zip(positions, self.sizes, strict=True):
            if not (
                isinstance(epoch, int)
                and isinstance(offset, int)
                and epoch >= 0
                and 0 <= offset < max(size, 1)
            ):
                raise ValueError(f"bad source position [{epoch}, {offset}] for a source of {size} rows")
            checked.append([epoch, offset])
        self.draws, self.positions = draws, checked

    def finished(self, state: dict[str, Any]) -> bool:
        return bool(self.num_epoch) and state["draws"] >= self.num_epoch * self.total

    def epoch_of(self, state: dict[str, Any]) -> int:
        return state["draws"] // self.total


Order = ConcatOrder | WeightedOrder


def make_order(
    sizes: list[int], weights: list[float] | None, seed: int, shuffle: bool, num_epoch: int
) -> ConcatOrder | WeightedOrder:
    """WeightedOrder when weights are given, else ConcatOrder."""
    if weights:
        return WeightedOrder(sizes, weights, seed, shuffle, num_epoch)
    return ConcatOrder(sizes, seed, shuffle, num_epoch)


def _int(state: dict[str, Any], key: str) -> int:
    value = state.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer (got {value!r})")
    return value
