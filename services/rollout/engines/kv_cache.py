"""A left-padded KV cache over rows that join and leave at different times.

All rows share one column axis: a row's real tokens are right-aligned and the columns before
them are padding (attention mask 0). Each row keeps its own position id, so padding never shifts
positions. Rows that finish are dropped (`select`); rows that join after their prefill are
left-padded to the common length (`merge`); columns that became padding for every row are cut
(`trim`), so the cache is only as long as its oldest live row.

    cols:      0 1 2 3 4 5 6
    row a:     . . p p p r r      (p prompt, r response, . padding)
    row b:     p p p p r r r
    row c:     . . . . p p r      <- joined later, padded on the left
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def _pad_left(tensor: torch.Tensor, columns: int, dim: int) -> torch.Tensor:
    if columns == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = columns
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class PaddedBatch:
    """KV cache, attention mask [B, L], next position ids [B] and next input tokens [B] of live rows."""

    def __init__(
        self, cache: DynamicCache, mask: torch.Tensor, positions: torch.Tensor, next_tokens: torch.Tensor
    ):
        self.cache = cache
        self.mask = mask
        self.positions = positions
        self.next_tokens = next_tokens

    @property
    def num_rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def num_columns(self) -> int:
        return int(self.mask.shape[1])

    def _layers(self):
        return [layer for layer in self.cache.layers if getattr(layer, "keys", None) is not None]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices, in the new order)."""
        for layer in self._layers():
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)
        self.mask = self.mask.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)
        self.next_tokens = self.next_tokens.index_select(0, rows)

    def repeat_rows(self, rows: torch.Tensor) -> None:
        """Replace the rows by `rows` (indices, repeats allowed): one prefill shared by n samples."""
        self.select(rows)

    def merge(self, other: PaddedBatch) -> None:
        """Append `other`'s rows after ours, left-padding whichever side is shorter."""
        length = max(self.num_columns, other.num_columns)
        pad_self, pad_other = length - self.num_columns, length - other.num_columns
        for mine, theirs in zip(self._layers(), other._layers(), strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, pad_self, 2), _pad_left(theirs.keys, pad_other, 2)])
            mine.values = torch.cat(
                [_pad_left(mine.values, pad_self, 2), _pad_left(theirs.values, pad_other, 2)]
            )
        self.mask = torch.cat([_pad_left(self.mask, pad_self, 1), _pad_left(other.mask, pad_other, 1)])
        self.positions = torch.cat([self.positions, other.positions])
        self.next_tokens = torch.cat([self.next_tokens, other.next_tokens])

    def trim(self) -> None:
        """Cut leading columns that are padding in every row."""
        live = self.mask.any(dim=0).nonzero()
        start = int(live[0]) if live.numel() else self.num_columns
        if start == 0:
            return
        for layer in self._layers():
            layer.keys = layer.keys[:, :, start:]
            layer.values = layer.values[:, :, start:]
        self.mask = self.mask[:, start:]

    def step_inputs(self) -> dict[str, torch.Tensor]:
        """Model inputs that decode one token per row (the new column joins the mask)."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.num_rows, 1)], dim=1)
        return dict(
            input_ids=self.next_tokens.unsqueeze(-1),
            attention_mask=self.mask,
            position_ids=self.positions.unsqueeze(-1),
            past_key_values=self.cache,
        )

    def advance(self, tokens: torch.Tensor) -> None:
        """After a decode step: the sampled `tokens` are the next inputs, one position further."""
        self.positions = self.positions + 1
        self.next_tokens = tokens


def prefill_inputs(
    prompts: list[tuple[int, ...]], pad_token_id: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Left-padded input ids, attention mask and per-row position ids for a prefill forward."""
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, length - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, length - len(prompt) :] = 1
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return dict(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        past_key_values=DynamicCache(),
    )
