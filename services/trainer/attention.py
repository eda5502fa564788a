"""How a packed row is shown to the attention kernel so that samples never see each other.

transformers 5.23 infers packed samples from position_ids only when no KV cache exists: with
the config's default use_cache=True (train mode included) it creates a DynamicCache and lets a
packed sample silently attend to the samples before it. The trainer therefore never relies on
that inference; it passes the sample boundaries explicitly:

- sdpa (`--attn-implementation sdpa`) runs as `rollway_varlen_sdpa`: the row's samples are
  gathered into a few [samples, longest] padded batches (samples of similar length together,
  `VarlenLayout`), each goes through one causal SDPA call, and one index scatters the outputs
  back to row order. Under a causal mask a sample's tokens never see its own padding slots,
  so this is the varlen math: O(sum of len^2), no [L, L] mask, and - unlike one SDPA call per
  sample - no per-sample slices whose backward writes a row-sized zero tensor each.
- flash_attention_2 gets the same `cu_seq_lens_*` / `max_length_*` (its native varlen inputs).
- eager gets an explicit block-diagonal causal additive mask built from the segments.

A segment of a shared prefix tree (micro_batch.py) also attends to its ancestor segments. sdpa
does this one of two ways per subtree, whichever costs less (`row_units`; blocks on CPU only): it
gathers the ancestors' keys and values in front of each segment (the segment's sequence is the
sample's tokens up to it, as if alone), or it attends the subtree at once as one masked block
(`TreeBlock`: its tokens once, each segment seeing its ancestors whole and itself causally). eager allows the ancestors in
its mask. flash_attention_2's cu_seq_lens cannot say this, so the engine shares prefixes only with
sdpa and eager (SHARED_PREFIX_KERNELS).

Padded rows (one right-padded sample per row) need no boundaries: under a causal mask a real
token only sees earlier real tokens, and padding outputs carry no loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rollway.trainer.micro_batch import MicroBatch

VARLEN_SDPA = "rollway_varlen_sdpa"
VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
LAYOUT_KWARG = "rollway_varlen_layout"
SHARED_PREFIX_KERNELS = ("sdpa", "eager")
# Samples whose lengths are within this factor of the longest of their group share one SDPA call
# (bounds the padding slots to ~25% of a group, and the number of calls to a few per row).
GROUP_LENGTH_RATIO = 1.25
# Short ones join a group whatever the ratio while padding them costs at most this many attention
# scores (longest^2 - length^2): an SDPA call costs more than that to launch on CPU. A GRPO row of
# the tiny model went from 5 calls per layer to 2 (trainer step 0.071 -> 0.068 s).
PAD_SCORES_PER_CALL = 64 * 64
# On CPU a subtree goes as one masked block when the block's attention (its length squared) costs
# less than this many times its gathered sequences' (their lengths squared, summed; row_units).
# The gathered layout also pays per sequence: one more (sample, head) problem in the kernel and
# copies of the ancestors' keys and values. GRPO groups of short responses win as blocks (tiny
# model, 16 groups of an 18-token prompt and 8 responses of 8 tokens: attention forward and
# backward 4.7 -> 1.9 ms per layer, ratio 1.24); long responses under a short prompt do not
# (8 x 1000 tokens under 100: ratio 6.8). On CUDA blocks are off (ratio 0): a masked SDPA call
# leaves the flash kernel, which takes causal masks only, and that trade is not measured here.
BLOCK_COST_RATIO = 2.0


@dataclass(frozen=True)
class VarlenLayout:
    """Where the tokens of one packed row go for attention, built once per micro-batch.

    Slots are laid out group after group; group g is a [count, longest] block (sequence-major).
    A sequence in a shared prefix tree has its ancestors' positions first (their keys and values,
    seen by every query after them; those slots' outputs are not read back: each ancestor's own
    sequence gives them). A padding slot repeats its sequence's last token: it sits after the real
    tokens, so causal attention never lets a real query see it, and its output is never read back.
    """

    gather: torch.Tensor  # [slots] row position read into each slot
    scatter: torch.Tensor  # [row length] slot whose output is each row position's
    groups: tuple[tuple[int, int], ...]  # (count, longest) of each group, in slot order
    # per group: None (causal sequences) or [count, 1, longest, longest] bool (tree blocks)
    masks: tuple[torch.Tensor | None, ...] = ()

    def to(self, device: torch.device) -> VarlenLayout:
        masks = tuple(None if m is None else m.to(device) for m in self.masks)
        return VarlenLayout(self.gather.to(device), self.scatter.to(device), self.groups, masks)


@dataclass(frozen=True)
class AttentionSequence:
    """Row positions [start, start + length) that attend causally among themselves, after the
    `prefix` ranges (their ancestors in a shared prefix tree, in row order), which they all see."""

    own: tuple[int, int]
    prefix: tuple[tuple[int, int], ...] = ()

    def __len__(self) -> int:
        return self.own[1] + sum(length for _, length in self.prefix)


@dataclass(frozen=True)
class TreeBlock:
    """A subtree of a prefix tree attended at once: the ranges of its root's ancestors (`prefix`,
    keys and values only, like a sequence's prefix), then its segments' row ranges (depth-first,
    so in row order) with each one's parent, an index into `segments` (-1 for the subtree root)."""

    prefix: tuple[tuple[int, int], ...]
    segments: tuple[tuple[int, int], ...]
    parents: tuple[int, ...]

    def __len__(self) -> int:
        return sum(length for _, length in (*self.prefix, *self.segments))

    def allowed(self, longest: int) -> torch.Tensor:
        """[longest, longest] bool over the block's slots (prefix, segments, padding): a segment's
        query sees the whole prefix, its ancestor segments whole and its own segment up to itself.
        Prefix and padding slots are never read back; each sees the slots up to itself (a query
        that sees nothing would be NaN, in the backward too)."""
        prefix = sum(length for _, length in self.prefix)
        segment = torch.cat(
            [torch.full((length,), i, dtype=torch.long) for i, (_, length) in enumerate(self.segments)]
        )
        end = prefix + len(segment)
        causal = torch.ones(longest, longest, dtype=torch.bool).tril()
        ancestors = ancestor_matrix(list(self.parents))[segment[:, None], segment[None, :]]
        same = segment[:, None] == segment[None, :]
        allowed = causal.clone()
        allowed[prefix:end, :prefix] = True
        allowed[prefix:end, prefix:end] = (same & causal[: end - prefix, : end - prefix]) | ancestors
        return allowed


def _row_segments(segment_ids: torch.Tensor) -> tuple[list[int], list[tuple[int, int]]]:
    """Segment id and (start, length) of each segment of one packed row, in row order."""
    bounds = segment_bounds(segment_ids).tolist()
    ids = segment_ids.reshape(-1)[bounds[:-1]].tolist()
    return ids, [(bounds[k], bounds[k + 1] - bounds[k]) for k in range(len(ids))]


def row_sequences(
    segment_ids: torch.Tensor, segment_parents: torch.Tensor | None = None
) -> list[AttentionSequence]:
    """The attention sequences of one packed row: each segment (samples or tree segments, then the
    padding tail), preceded by its ancestor segments (micro_batch.py)."""
    ids, spans = _row_segments(segment_ids)
    parents = segment_parents.tolist() if segment_parents is not None else []
    ranges = {segment: span for segment, span in zip(ids, spans, strict=True) if segment >= 0}
    sequences = []
    for segment, span in zip(ids, spans, strict=True):
        prefix: list[tuple[int, int]] = []
        parent = parents[segment] if 0 <= segment < len(parents) else -1
        while parent >= 0:
            prefix.append(ranges[parent])
            parent = parents[parent]
        sequences.append(AttentionSequence(span, tuple(reversed(prefix))))
    return sequences


def row_units(
    segment_ids: torch.Tensor,
    segment_parents: torch.Tensor | None = None,
    block_cost_ratio: float = BLOCK_COST_RATIO,
) -> list[AttentionSequence | TreeBlock]:
    """What one packed row's attention runs on: sequences (row_sequences), except the subtrees
    that are cheaper as one TreeBlock.

    Cost: a sequence's length squared; a block's length squared divided by `block_cost_ratio`
    (BLOCK_COST_RATIO). Bottom-up, each segment with children takes the cheaper of its subtree as
    a block, or itself as a sequence plus its children's best; top-down, the choices are read out.
    (A GRPO row of prompts under one chat template: the template is a sequence, each prompt with
    its responses a block.)"""
    sequences = row_sequences(segment_ids, segment_parents)
    ids, _ = _row_segments(segment_ids)
    parents = segment_parents.tolist() if segment_parents is not None else []
    slot = {segment: k for k, segment in enumerate(ids) if 0 <= segment < len(parents)}
    children: dict[int, list[int]] = {segment: [] for segment in slot}
    for segment in slot:  # row order: children in row order too
        if parents[segment] >= 0:
            children[parents[segment]].append(segment)
    order = list(slot)  # depth-first: a subtree is a run of `size` segments from its root
    position = {segment: i for i, segment in enumerate(order)}
    tokens: dict[int, int] = {}  # the subtree's tokens
    size: dict[int, int] = {}  # the subtree's segments
    best: dict[int, float] = {}
    as_block: set[int] = set()
    for segment in reversed(order):  # children first
        sequence = sequences[slot[segment]]
        tokens[segment] = sequence.own[1] + sum(tokens[c] for c in children[segment])
        size[segment] = 1 + sum(size[c] for c in children[segment])
        gathered = len(sequence) ** 2 + sum(best[c] for c in children[segment])
        block = (len(sequence) - sequence.own[1] + tokens[segment]) ** 2 / max(block_cost_ratio, 1e-30)
        best[segment] = gathered
        if children[segment] and block < gathered:
            best[segment] = block
            as_block.add(segment)

    # Read out in row order (iteratively: a tree may be deep).
    units: list[AttentionSequence | TreeBlock] = []
    pending = [segment for segment in reversed(slot) if parents[segment] < 0]
    while pending:
        segment = pending.pop()
        sequence = sequences[slot[segment]]
        if segment not in as_block:
            units.append(sequence)
            pending.extend(reversed(children[segment]))
            continue
        members = order[position[segment] : position[segment] + size[segment]]
        index = {s: i for i, s in enumerate(members)}
        units.append(
            TreeBlock(
                sequence.prefix,
                tuple(sequences[slot[s]].own for s in members),
                tuple(index.get(parents[s], -1) for s in members),
            )
        )
    return units + [seq for k, seq in enumerate(sequences) if ids[k] not in slot]


def varlen_layout(units: Sequence[AttentionSequence | TreeBlock]) -> VarlenLayout:
    """The layout of a row's attention units (row_units, or row_sequences: sequences only).
    Sequences and tree blocks form separate groups: causal ones, and masked ones."""
    gather: list[int] = []
    scatter = [0] * sum(seq.own[1] for seq in units if isinstance(seq, AttentionSequence))
    scatter += [0] * sum(n for unit in units if isinstance(unit, TreeBlock) for _, n in unit.segments)
    groups: list[tuple[int, int]] = []
    masks: list[torch.Tensor | None] = []
    for kind in (AttentionSequence, TreeBlock):
        order = sorted((unit for unit in units if isinstance(unit, kind)), key=lambda unit: -len(unit))
        k = 0
        while k < len(order):
            longest = len(order[k])
            end = k
            while end < len(order) and (
                len(order[end]) * GROUP_LENGTH_RATIO >= longest
                or longest**2 - len(order[end]) ** 2 <= PAD_SCORES_PER_CALL
            ):
                end += 1
            for unit in order[k:end]:
                last = _place(unit, gather, scatter)
                gather.extend([last] * (longest - len(unit)))
            groups.append((end - k, longest))
            masks.append(
                None
                if kind is AttentionSequence
                else torch.stack([u.allowed(longest) for u in order[k:end]])[:, None]
            )
            k = end
    return VarlenLayout(torch.tensor(gather), torch.tensor(scatter), tuple(groups), tuple(masks))


def _place(unit: AttentionSequence | TreeBlock, gather: list[int], scatter: list[int]) -> int:
    """Append `unit`'s slots to `gather`, point its own row positions at them in `scatter`;
    return the row position its padding slots repeat (its last one)."""
    if isinstance(unit, TreeBlock):
        for start, length in unit.prefix:
            gather.extend(range(start, start + length))
        for start, length in unit.segments:
            scatter[start : start + length] = range(len(gather), len(gather) + length)
            gather.extend(range(start, start + length))
        return gather[-1]
    start, length = unit.own
    for prefix_start, prefix_length in unit.prefix:
        gather.extend(range(prefix_start, prefix_start + prefix_length))
    scatter[start : start + length] = range(len(gather), len(gather) + length)
    gather.extend(range(start, start + length))
    return start + length - 1


def varlen_sdpa_forward(module, query, key, value, attention_mask, **kwargs) -> tuple[torch.Tensor, None]:
    """Causal SDPA within each sample of a packed row ([1, heads, L, dim] in, [1, L, heads, dim] out)."""
    layout: VarlenLayout | None = kwargs.pop(LAYOUT_KWARG, None)
    for name in VARLEN_KWARGS:
        kwargs.pop(name, None)
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # [1, heads, L, dim] -> [heads, slots, dim]: one gather per tensor for the whole row.
    q, k, v = (t[0].index_select(1, layout.gather) for t in (query, key, value))
    outputs, offset = [], 0
    masks = layout.masks or (None,) * len(layout.groups)
    for (count, longest), mask in zip(layout.groups, masks, strict=True):
        size = count * longest

        def block(t, offset=offset, size=size, count=count, longest=longest):
            return t[:, offset : offset + size].unflatten(1, (count, longest)).transpose(0, 1)

        out = sdpa_attention_forward(
            module, block(q), block(k), block(v), mask, is_causal=mask is None, **kwargs
        )[0]
        outputs.append(out.flatten(0, 1))  # [count, longest, heads, dim] -> [size, heads, dim]
        offset += size
    flat = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    return flat.index_select(0, layout.scatter)[None], None


AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_forward)


def hf_attn_implementation(name: str) -> str:
    """The transformers attention implementation the trainer builds the model with."""
    return VARLEN_SDPA if name == "sdpa" else name


def segment_bounds(segment_ids: torch.Tensor) -> torch.Tensor:
    """Cumulative segment boundaries of one packed row (samples, then the padding tail): int32."""
    row = segment_ids.reshape(-1)
    starts = torch.nonzero(row[1:] != row[:-1])[:, 0] + 1
    ends = torch.tensor([row.numel()])
    return torch.cat([torch.zeros(1, dtype=torch.long), starts, ends]).to(torch.int32)


def block_causal_mask(segment_ids: torch.Tensor, segment_parents: torch.Tensor | None = None) -> torch.Tensor:
    """[rows, 1, L, L] bool, True where query q may attend key k: same segment and k <= q, or k in
    an ancestor segment of q's (segment_parents, a shared prefix tree).

    Padding (segment -1) attends causally to padding only, so no row of the mask is empty.
    """
    length = segment_ids.shape[-1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment_ids.device).tril()
    allowed = same & causal
    if segment_parents is not None and bool((segment_parents >= 0).any()):
        ancestors = ancestor_matrix(segment_parents.tolist()).to(segment_ids.device)
        index = segment_ids.clamp(min=0)
        real = (segment_ids >= 0)[:, :, None] & (segment_ids >= 0)[:, None, :]
        allowed |= ancestors[index[:, :, None], index[:, None, :]] & real
    return allowed[:, None]


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """[segments, segments] bool: [s, a] is True where a is a strict ancestor of s."""
    matrix = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for segment in range(len(parents)):
        parent = parents[segment]
        while parent >= 0:
            matrix[segment, parent] = True
            parent = parents[parent]
    return matrix


def model_inputs(
    mb: MicroBatch,
    attn_implementation: str,
    dtype: torch.dtype,
    device: torch.device,
    block_cost_ratio: float | None = None,
) -> dict[str, Any]:
    """Keyword arguments of the model's forward for this micro-batch (`block_cost_ratio`: row_units,
    by default BLOCK_COST_RATIO on CPU and 0 elsewhere; tests set 0 or inf to pin sdpa's layout)."""
    inputs: dict[str, Any] = {
        "input_ids": mb.input_ids.to(device),
        "position_ids": mb.position_ids.to(device),
        "use_cache": False,
    }
    if not mb.packed:
        inputs["attention_mask"] = mb.attention_mask.to(device)
    elif attn_implementation == "eager":
        allowed = block_causal_mask(mb.segment_ids.to(device), mb.segment_parents)
        # eager adds the mask to the scores: 0 where allowed, the dtype's minimum elsewhere.
        zero = torch.zeros((), dtype=dtype, device=device)
        inputs["attention_mask"] = torch.where(allowed, zero, torch.finfo(dtype).min)
    elif attn_implementation == "sdpa":
        if block_cost_ratio is None:
            block_cost_ratio = BLOCK_COST_RATIO if device.type == "cpu" else 0.0
        layout = varlen_layout(row_units(mb.segment_ids, mb.segment_parents, block_cost_ratio))
        inputs[LAYOUT_KWARG] = layout.to(device)
    else:
        if bool((mb.segment_parents >= 0).any()):
            raise ValueError(
                f"{attn_implementation} has no shared-prompt layout (the engine shares prompts for sdpa and eager only)"
            )
        bounds = segment_bounds(mb.segment_ids)
        longest = int((bounds[1:] - bounds[:-1]).max())
        inputs.update(
            cu_seq_lens_q=bounds.to(device),
            cu_seq_lens_k=bounds.to(device),
            max_length_q=longest,
            max_length_k=longest,
        )
    return inputs


def shares_prefixes(config, packing: bool) -> bool:
    """Samples that begin alike (a GRPO group's prompt) share those tokens in a packed row
    (micro_batch.py) where the run's attention kernel can show them to each sample."""
    return packing and config.attn_implementation in SHARED_PREFIX_KERNELS
