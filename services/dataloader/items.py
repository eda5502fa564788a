"""Making stream entries: draw a row, read it, tokenise it, drop it or turn it into a DataItem.

Each entry carries the order cursor just after its draw and the counter increments it brings
(its own item plus the rows dropped or skipped since the previous entry), so that counters
and cursor advance together when a batch is served, never when an item is merely prefetched.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rollway.common.log import get_logger
from rollway.dataloader.datasets import OpenedSource
from rollway.dataloader.encoder import Encoded, Encoder
from rollway.dataloader.order import ConcatOrder, WeightedOrder
from rollway.dataloader.rows import Row, RowProblem
from rollway.dataloader.v1 import dataloader_pb2

log = get_logger(__name__)

LOGGED_SKIPS = 5


@dataclass
class Entry:
    """One step of the stream: an item, the end of the stream, or an error that stops it."""

    item: dataloader_pb2.DataItem | None
    cursor: dict[str, Any]  # order cursor after this entry (for an error: before the bad row)
    counts: Counter = field(default_factory=Counter)
    end: bool = False
    error: str | None = None

    @property
    def terminal(self) -> bool:
        return self.end or self.error is not None


def make_item(row: Row, encoded: Encoded, source: str, epoch: int) -> dataloader_pb2.DataItem:
    """The DataItem of a tokenised row."""
    item = dataloader_pb2.DataItem(
        prompt_token_ids=encoded.prompt_ids,
        token_ids=encoded.token_ids,
        loss_mask=encoded.loss_mask,
        label=row.label,
        source=source,
        row_index=row.row_index,
        epoch=epoch,
        prompt_text=encoded.prompt_text,
    )
    if row.metadata:
        item.metadata.update(row.metadata)
    return item


class ItemFactory:
    """Produces entries from an order over opened sources (runs on the prefetch thread)."""

    def __init__(
        self,
        sources: list[OpenedSource],
        encoder: Encoder,
        order: ConcatOrder | WeightedOrder,
        max_len: int,
        skip_bad_rows: bool,
    ):
        self.sources = sources
        self.encoder = encoder
        self.order = order
        self.max_len = max_len
        self.skip_bad_rows = skip_bad_rows
        self._num_skips = 0

    def next_entry(self) -> Entry:
        """Draw until one row gives an item, the order ends, or a row fails (without skip_bad_rows)."""
        counts: Counter = Counter()
        while True:
            before = self.order.state()
            draw = self.order.next()
            if draw is None:
                return Entry(None, self.order.state(), counts, end=True)
            source = self.sources[draw.source]
            name = source.spec.name
            row = source.row(draw.position)
            try:
                encoded = self.encoder.encode(row)
                item = make_item(row, encoded, name, draw.epoch)
            except RowProblem as problem:
                message = f"{source.spec.path}: row {row.row_index}: {problem}"
                if not self.skip_bad_rows:
                    return Entry(None, before, counts, error=message + " (--skip-bad-rows skips such rows)")
                counts.update({"skipped_bad_rows": 1, "rejected_by_tokenizer": 1})
                self._log_skip(message)
                continue
            if self.max_len and encoded.num_tokens > self.max_len:
                counts.update({"dropped_too_long": 1, f"dropped_too_long/{name}": 1})
                continue
            counts.update({"items_served": 1, f"items_served/{name}": 1})
            return Entry(item, self.order.state(), counts)

    def _log_skip(self, message: str) -> None:
        self._num_skips += 1
        if self._num_skips <= LOGGED_SKIPS:
            log.warning("skipped a row the tokenizer rejected", problem=message)
