"""Turn a micro-batch's samples into model inputs and per-target tensors.

A sample is prompt + response tokens t_0..t_{n-1}. Position p of a row predicts the next token
of the same sample. Only positions that predict a response token matter to the loss and the
log-probs, so the per-target tensors (targets, loss mask, per-token inputs) hold just those:
target k is predicted at row column `logit_columns[k]`, and the model computes logits there only
(lm_head and the log-softmax skip prompts and padding).

Packed (default): one row [t^a_0..t^a_{na-1}, t^b_0.., pad..]; position_ids restart at 0 per
sample; `segment_ids` tell the attention where samples end (attention.py); the row is padded to
a multiple of `pad_multiple`. Padded: one row per sample, right-padded, with an attention mask.

Shared prefixes (packed, `share_prefixes`): the row holds the micro-batch's samples as a prefix
tree, depth-first: tokens that several samples begin with (the prompt of a GRPO group, the chat
template and the common words of SFT prompts) are in the row once. A segment is a run of tree
nodes without a branch; it attends causally to itself and to all of its ancestor segments
(`segment_parents`), and positions are depths in the tree. So every sample sees exactly its own
tokens, as if alone, and a shared prefix is computed once. The node where samples part predicts
each of their next tokens: its column appears once per sample in `logit_columns`.

    samples  [p q a b] [p q c] [p r]   ->   row  p q | a b | c | r     segments 0 | 1 | 2 | 3
                                                                       parents  -  0   0   ...
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
    segment_parents: torch.Tensor  # [segments] the segment each continues (shared prefix), -1 for none
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


@dataclass
class PrefixTree:
    """The samples of a packed row as a prefix tree laid out depth-first (module docstring)."""

    tokens: list[int]  # per column
    depths: list[int]  # per column: the position id
    segments: list[int]  # per column
    segment_parents: list[int]  # per segment: the segment it continues, -1 for none
    paths: list[list[int]]  # per sample: the column of each of its tokens


def prefix_tree(items: Sequence[SequenceItem], share_prefixes: bool) -> PrefixTree:
    """The tree of `items`, children in order of first appearance (one chain per sample when not
    sharing)."""
    children: list[dict] = [{}]  # node 0 is the root, above the first tokens
    node_tokens, node_depths = [-1], [-1]
    node_paths = []
    for k, item in enumerate(items):
        node, path = 0, []
        for depth, token in enumerate(item.token_ids):
            key = token if share_prefixes or depth else (k, token)  # unshared: a branch per sample
            child = children[node].get(key)
            if child is None:
                child = len(children)
                children[node][key] = child
                children.append({})
                node_tokens.append(token)
                node_depths.append(depth)
            path.append(child)
            node = child
        node_paths.append(path)
    tree = PrefixTree([], [], [], [], [])
    columns = [0] * len(children)
    node_segment = [-1] * len(children)
    stack = [(child, 0) for child in reversed(children[0].values())]  # (node, its parent)
    while stack:
        node, parent = stack.pop()
        columns[node] = len(tree.tokens)
        if parent and len(children[parent]) == 1:  # an only child continues its parent's segment
            segment = node_segment[parent]
        else:
            segment = len(tree.segment_parents)
            tree.segment_parents.append(node_segment[parent] if parent else -1)
        node_segment[node] = segment
        tree.tokens.append(node_tokens[node])
        tree.depths.append(node_depths[node])
        tree.segments.append(segment)
        stack.extend((child, node) for child in reversed(children[node].values()))
    tree.paths = [[columns[n] for n in path] for path in node_paths]
    return tree


def row_tokens(items: Sequence[SequenceItem], share_prefixes: bool) -> int:
    """Tokens the packed row of `items` holds before padding (shared prefixes once)."""
    return len(prefix_tree(items, share_prefixes).tokens) if share_prefixes else sum(map(len, items))


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


def _packed_row(items, pad_multiple, pad_token_id, share_prefixes, targets: _Targets):
    """input_ids, position_ids, segment_ids of one packed row, segment parents, real tokens."""
    tree = prefix_tree(items, share_prefixes)
    size = len(tree.tokens)
    pad = _round_up(max(size, 1), pad_multiple) - size
    for item, path in zip(items, tree.paths, strict=True):
        prompt = item.response_start
        skip = max(1 - prompt, 0)  # with no prompt the first response token has no prediction
        # Response token j is token prompt + j, predicted at the column of token prompt + j - 1.
        targets.add(item, 0, path[prompt + skip - 1 : len(item) - 1], skip)
    return (
        tree.tokens + [pad_token_id] * pad,
        tree.depths + [0] * pad,
        tree.segments + [-1] * pad,
        tree.segment_parents,
        size,
    )


def build_micro_batch(
    items: list[SequenceItem],
    *,
    packing: bool,
    pad_multiple: int,
    pad_token_id: int,
    extra_names: tuple = (),
    share_prefixes: bool = False,
) -> MicroBatch:
    """Tensors for `items` (an empty list gives one all-padding row that carries no loss)."""
    targets = _Targets(tuple(extra_names))
    if packing or not items:
        ids, positions, segments, parents, num_tokens = _packed_row(
            items, pad_multiple, pad_token_id, share_prefixes, targets
        )
        input_ids, position_ids = torch.tensor([ids]), torch.tensor([positions])
        segment_ids = torch.tensor([segments])
        segment_parents = torch.tensor(parents, dtype=torch.long)
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
        segment_parents = torch.full((rows,), -1, dtype=torch.long)
        attention_mask = (segment_ids >= 0).long()
        position_ids = torch.arange(length).expand(rows, length).clone()
        num_tokens = sum(len(item) for item in items)
    return _with_targets(
        input_ids, position_ids, segment_ids, segment_parents, attention_mask, rows, targets, num_tokens
    )


def _with_targets(
    input_ids, position_ids, segment_ids, segment_parents, attention_mask, rows, targets, num_tokens
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
        segment_parents=segment_parents,
        attention_mask=attention_mask,
        logit_columns=columns,
        target_ids=lay_out(targets.ids, 0, torch.long),
        loss_mask=lay_out(targets.mask, 0.0, torch.float32),
        sample_index=lay_out(targets.index, -1, torch.long),
        extras={name: lay_out(values, 0.0, torch.float32) for name, values in targets.extras.items()},
        spans=spans,
        num_tokens=num_tokens,
    )
