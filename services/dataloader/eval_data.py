"""Eval sources (--eval-prompt-data): every usable row in file order, read from an offset.

Eval is stateless on this side: the caller passes the offset the previous batch returned, so a
retry returns the same items and no cursor needs saving. Rows are tokenised like training rows
(the same encoder and length limit), without shuffling or epochs.
"""

from __future__ import annotations

from rollway.common.errors import FailedPrecondition, InvalidArgument
from rollway.dataloader.datasets import OpenedSource
from rollway.dataloader.encoder import Encoder
from rollway.dataloader.items import make_item
from rollway.dataloader.rows import RowProblem
from rollway.dataloader.v1 import dataloader_pb2


class EvalSets:
    """The opened eval sources, by name."""

    def __init__(self, sources: list[OpenedSource], encoder: Encoder, max_len: int, skip_bad_rows: bool):
        self.sources = sources
        self._by_name = {source.spec.name: source for source in sources}
        self.encoder = encoder
        self.max_len = max_len
        self.skip_bad_rows = skip_bad_rows

    def batch(self, name: str, offset: int, batch_size: int) -> dataloader_pb2.EvalBatchResponse:
        """Up to batch_size items of source `name`, starting at row position `offset`."""
        source = self._by_name.get(name)
        if source is None:
            known = ", ".join(self._by_name) or "none configured (--eval-prompt-data)"
            raise InvalidArgument("name", f"unknown eval source {name!r} (eval sources: {known})")
        num_rows = len(source.store)
        if not 0 <= offset <= num_rows:
            raise InvalidArgument(
                "offset", f"must be in [0, {num_rows}] for eval source {name!r} (got {offset})"
            )
        items, dropped, position = [], 0, offset
        while position < num_rows and len(items) < batch_size:
            row = source.row(position)
            position += 1
            try:
                encoded = self.encoder.encode(row)
            except RowProblem as problem:
                if not self.skip_bad_rows:
                    raise FailedPrecondition(f"{source.spec.path}: row {row.row_index}: {problem}") from None
                dropped += 1
                continue
            if self.max_len and encoded.num_tokens > self.max_len:
                dropped += 1
                continue
            items.append(make_item(row, encoded, name, epoch=0))
        return dataloader_pb2.EvalBatchResponse(
            items=items,
            next_offset=position,
            done=position >= num_rows,
            num_rows=num_rows,
            num_dropped=dropped,
        )
