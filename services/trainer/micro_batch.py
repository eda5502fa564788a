"""Turn a micro-batch's samples into model inputs and per-target tensors.

A sample is prompt + response tokens t_0..t_{n-1}. Position p of a row predicts the next token
of the same sample. Only positions that predict a response token matter to the loss and the
log-probs, so the per-target tensors (targets, loss mask, per-token inputs) hold just those:
target k is predicted at row column `logit_columns[k]`, and the model computes logits there only
(lm_head and the log-softmax skip prompts and padding).

Packed (default): one row [t^a_0..t^a_{na-1}, t^b_0.., pad..]; position_ids restart at 0 per
sample; `segment_ids` tell the attention where samples end (attention.py); the row is padded to
a multiple of `pad_multiple`. Padded: one row per sample, right-padded, with an attention mask.

Shared prompts (packed, `share_prompts`): samples of the micro-batch with the same prompt (the
n samples of a GRPO group) put it in the row once; each response is its own segment that also
attends to the prompt's segment (`prefix_ids`), with positions continuing after the prompt. So
every response sees exactly prompt + itself, as if alone, and the prompt is computed once. Its
last token predicts every response's first token: that column appears once per response.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """Model inputs [rows, length] and targets [rows, targets] of one micro-batch on one rank."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor  # sample slot per token, -1 for padding
    prefix_ids: torch.Tensor  # segment a token also attends to (its shared prompt), -1 for none
    attention_mask: torch.Tensor | None  # [rows, length] padding mask (padded layout only)
    logit_columns: torch.Tensor  # [targets] row column whose logits predict each target
    target_ids: torch.Tensor
    loss_mask: torch.Tensor  # float, 1 where the target token counts in the loss
    sample_index: torch.Tensor  # request index of the sample owning the target, -1 for none
    extras: dict[str, torch.Tensor]
    spans: list[tuple[int, int, int, int]]  # (sample index, row, first, end) targets of a response
    num_tokens: int  # real tokens in the rows (a shared prompt counts once)

    @property
    def packed(self) -> bool:
        return self.attention_mask is None


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def prompt_groups(items: Sequence[SequenceItem], share_prompts: bool) -> list[list[int]]:
    """Positions of `items` grouped by identical (non-empty) prompt, in order of first appearance;
    one group per item when not sharing."""
    if not share_prompts:
        return [[k] for k in range(len(items))]
    groups: list[list[int]] = []
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for k, item in enumerate(items):
        if item.response_start == 0:
            groups.append([k])
            continue
        key = tuple(item.token_ids[: item.response_start])
        if key in by_prompt:
            by_prompt[key].append(k)
        else:
            by_prompt[key] = [k]
            groups.append(by_prompt[key])
    return groups


def row_tokens(items: Sequence[SequenceItem], share_prompts: bool) -> int:
    """Tokens the packed row of `items` holds before padding (shared prompts once)."""
    total = 0
    for group in prompt_groups(items, share_prompts):
        prompt = items[group[0]].response_start if len(group) > 1 else 0
        total += prompt + sum(len(items[k]) - prompt for k in group)
    return total


class _Targets:
    """Per-target lists, appended sample by sample."""

    def __init__(self, extra_names: tuple[str, ...]):
        self.rows: list[int] = []
        self.columns: list[int] = []
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.index: list[int] = []
        self.extras: dict[str, list[float]] = {name: [] for name in extra_names}
        self.spans: list[tuple[int, int, int, int]] = []

    def add(self, item: SequenceItem, row: int, columns: list[int], skip: int) -> None:
        """Targets of `item`'s response tokens skip.. predicted at `columns`."""
        first = len(self.ids)
        self.rows.extend([row] * len(columns))
        self.columns.extend(columns)
        self.ids.extend(item.token_ids[item.response_start + skip :])
        self.mask.extend(item.loss_mask[skip:])
        self.index.extend([item.index] * len(columns))
        for name, values in self.extras.items():
            values.extend(item.extras[name][skip:])
        self.spans.append((item.index, row, first, first + len(columns)))


def _packed_row(items, length, pad_token_id, share_prompts, targets: _Targets):
    """input_ids, position_ids, segment_ids, prefix_ids of one packed row."""
    input_ids = [pad_token_id] * length
    positions = [0] * length
    segments = [-1] * length
    prefixes = [-1] * length
    cursor = slot = 0

    def place(tokens: list[int], first_position: int, prefix: int) -> int:
        nonlocal cursor, slot
        end = cursor + len(tokens)
        input_ids[cursor:end] = tokens
        positions[cursor:end] = range(first_position, first_position + len(tokens))
        segments[cursor:end] = [slot] * len(tokens)
        prefixes[cursor:end] = [prefix] * len(tokens)
        start, cursor, slot = cursor, end, slot + 1
        return start

    for group in prompt_groups(items, share_prompts):
        if len(group) == 1:
            item = items[group[0]]
            start, prompt = place(item.token_ids, 0, -1), item.response_start
            skip = max(1 - prompt, 0)  # with no prompt the first response token has no prediction
            # Response token k is token prompt + k, predicted at position start + prompt + k - 1.
            targets.add(item, 0, list(range(start + prompt + skip - 1, start + len(item) - 1)), skip)
            continue
        prompt = items[group[0]].response_start
        prompt_slot = slot
        prompt_last = place(items[group[0]].token_ids[:prompt], 0, -1) + prompt - 1
        for k in group:
            item = items[k]
            start = place(item.token_ids[prompt:], prompt, prompt_slot)
            targets.add(item, 0, [prompt_last, *range(start, start + len(item) - prompt - 1)], 0)
    return input_ids, positions, segments, prefixes, cursor


def build_micro_batch(
    items: list[SequenceItem],
    *,
    packing: bool,
    pad_multiple: int,
    pad_token_id: int,
    extra_names: tuple = (),
    share_prompts: bool = False,
) -> MicroBatch:
    """Tensors for `items` (an empty list gives one all-padding row that carries no loss)."""
    targets = _Targets(tuple(extra_names))
    if packing or not items:
        length = _round_up(max(row_tokens(items, share_prompts), 1), pad_multiple)
        ids, positions, segments, prefixes, num_tokens = _packed_row(
            items, length, pad_token_id, share_prompts, targets
        )
        input_ids, position_ids = torch.tensor([ids]), torch.tensor([positions])
        segment_ids, prefix_ids = torch.tensor([segments]), torch.tensor([prefixes])
        attention_mask = None
        rows = 1
    else:
        rows, length = len(items), max(len(item) for item in items)
        input_ids = torch.full((rows, length), pad_token_id, dtype=torch.long)
        segment_ids = torch.full((rows, length), -1, dtype=torch.long)
        for row, item in enumerate(items):
            input_ids[row, : len(item)] = torch.tensor(item.token_ids)
            segment_ids[row, : len(item)] = row
            skip = max(1 - item.response_start, 0)
            targets.add(item, row, list(range(item.response_start + skip - 1, len(item) - 1)), skip)
        prefix_ids = torch.full_like(segment_ids, -1)
        attention_mask = (segment_ids >= 0).long()
        position_ids = torch.arange(length).expand(rows, length).clone()
        num_tokens = sum(len(item) for item in items)
    return _with_targets(
        input_ids, position_ids, segment_ids, prefix_ids, attention_mask, rows, targets, num_tokens
    )


def _with_targets(
    input_ids, position_ids, segment_ids, prefix_ids, attention_mask, rows, targets, num_tokens
):
    """Per-target tensors [rows, targets]. A packed row's targets are its columns in order; padded
    rows share one column range (their responses' union), holes and other rows' targets masked."""
    packed = attention_mask is None
    if packed:
        columns = torch.tensor(targets.columns or [0], dtype=torch.long)
        width = len(targets.columns) or 1
        place = list(range(len(targets.columns)))
        spans = targets.spans
    else:
        low = min(targets.columns, default=0)
        width = max(max(targets.columns, default=0) - low + 1, 1)
        columns = torch.arange(low, low + width)
        place = [column - low for column in targets.columns]
        spans = []  # a padded row's span starts at its first target's column
        for index, row, begin, end in targets.spans:
            first = targets.columns[begin] - low if end > begin else 0
            spans.append((index, row, first, first + end - begin))
    rows_index = torch.tensor(targets.rows, dtype=torch.long)
    place_index = torch.tensor(place, dtype=torch.long)

    def lay_out(values: list, fill, dtype) -> torch.Tensor:
        out = torch.full((rows, width), fill, dtype=dtype)
        if values:
            out[rows_index, place_index] = torch.tensor(values, dtype=dtype)
        return out

    return MicroBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        segment_ids=segment_ids,
        prefix_ids=prefix_ids,
        attention_mask=attention_mask,
        logit_columns=columns,
        target_ids=lay_out(targets.ids, 0, torch.long),
        loss_mask=lay_out(targets.mask, 0.0, torch.float32),
        sample_index=lay_out(targets.index, -1, torch.long),
        extras={name: lay_out(values, 0.0, torch.float32) for name, values in targets.extras.items()},
        spans=spans,
        num_tokens=num_tokens,
    )
