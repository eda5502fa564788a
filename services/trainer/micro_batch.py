"""Turn a micro-batch's samples into model inputs and per-target tensors.

A sample is prompt + response tokens t_0..t_{n-1}. Position p of a row predicts the next token
of the same sample, so every per-token quantity is stored at its *target* position: the loss
mask and the per-token inputs (advantages, old log-probs, ...) of token t_{j+1} sit at j.

Packed (default): one row [t^a_0..t^a_{na-1}, t^b_0.., pad..]; position_ids restart at 0 per
sample; `segment_ids` tell the attention where samples end (attention.py); the row is padded to
a multiple of `pad_multiple`. Padded: one row per sample, right-padded, with an attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SequenceItem:
    """One validated sample, as the trainer sees it."""

    index: int  # position in the request
    token_ids: list[int]  # prompt + response
    response_start: int  # number of prompt tokens
    loss_mask: list[int]  # one per response token
    extras: dict[str, list[float]] = field(default_factory=dict)  # per response token
    source: str = ""  # data source (for per-source metrics)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class MicroBatch:
    """Model inputs [rows, length] and targets of one micro-batch on one rank."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor  # sample slot per token, -1 for padding
    attention_mask: torch.Tensor | None  # [rows, length] padding mask (padded layout only)
    target_ids: torch.Tensor
    loss_mask: torch.Tensor  # float, 1 where the target token counts in the loss
    sample_index: torch.Tensor  # request index of the sample owning the target, -1 for none
    extras: dict[str, torch.Tensor]
    spans: list[tuple[int, int, int, int]]  # (sample index, row, first, end) response targets
    num_tokens: int  # real tokens

    @property
    def packed(self) -> bool:
        return self.attention_mask is None


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def build_micro_batch(
    items: list[SequenceItem], *, packing: bool, pad_multiple: int, pad_token_id: int, extra_names: tuple = ()
) -> MicroBatch:
    """Tensors for `items` (an empty list gives one all-padding row that carries no loss)."""
    lengths = [len(item) for item in items]
    if packing or not items:
        rows, length = 1, _round_up(max(sum(lengths), 1), pad_multiple)
        offsets = [(0, sum(lengths[:k])) for k in range(len(items))]
    else:
        rows, length = len(items), max(lengths)
        offsets = [(k, 0) for k in range(len(items))]
    input_ids = torch.full((rows, length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((rows, length), dtype=torch.long)
    segment_ids = torch.full((rows, length), -1, dtype=torch.long)
    target_ids = torch.zeros((rows, length), dtype=torch.long)
    loss_mask = torch.zeros((rows, length), dtype=torch.float32)
    sample_index = torch.full((rows, length), -1, dtype=torch.long)
    extras = {name: torch.zeros((rows, length), dtype=torch.float32) for name in extra_names}
    spans = []
    for slot, (item, (row, start)) in enumerate(zip(items, offsets, strict=True)):
        n, prompt = len(item), item.response_start
        end = start + n
        input_ids[row, start:end] = torch.tensor(item.token_ids)
        position_ids[row, start:end] = torch.arange(n)
        segment_ids[row, start:end] = slot
        target_ids[row, start : end - 1] = input_ids[row, start + 1 : end]
        sample_index[row, start : end - 1] = item.index
        # Response token k is token prompt + k, predicted at position start + prompt + k - 1.
        first = start + max(prompt, 1) - 1
        skip = max(1 - prompt, 0)  # with no prompt the first response token has no prediction
        loss_mask[row, first : end - 1] = torch.tensor(item.loss_mask[skip:], dtype=torch.float32)
        for name in extra_names:
            extras[name][row, first : end - 1] = torch.tensor(item.extras[name][skip:], dtype=torch.float32)
        spans.append((item.index, row, first, end - 1))
    if not packing and items:
        attention_mask = (segment_ids >= 0).long()
        position_ids = torch.arange(length).expand(rows, length).clone()
    else:
        attention_mask = None
    return MicroBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        segment_ids=segment_ids,
        attention_mask=attention_mask,
        target_ids=target_ids,
        loss_mask=loss_mask,
        sample_index=sample_index,
        extras=extras,
        spans=spans,
        num_tokens=sum(lengths),
    )
