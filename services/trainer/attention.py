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

Padded rows (one right-padded sample per row) need no boundaries: under a causal mask a real
token only sees earlier real tokens, and padding outputs carry no loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rollway.trainer.micro_batch import MicroBatch

VARLEN_SDPA = "rollway_varlen_sdpa"
VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
LAYOUT_KWARG = "rollway_varlen_layout"
# Samples whose lengths are within this factor of the longest of their group share one SDPA call
# (bounds the padding slots to ~25% of a group, and the number of calls to a few per row).
GROUP_LENGTH_RATIO = 1.25


@dataclass(frozen=True)
class VarlenLayout:
    """Where the tokens of one packed row go for attention, built once per micro-batch.

    Slots are laid out group after group; group g is a [count, longest] block (segment-major).
    A padding slot repeats its segment's last token: it sits after the real tokens, so causal
    attention never lets a real query see it, and its output is never read back.
    """

    gather: torch.Tensor  # [slots] row position read into each slot
    scatter: torch.Tensor  # [row length] slot whose output is each row position's
    groups: tuple[tuple[int, int], ...]  # (count, longest) of each group, in slot order


def varlen_layout(bounds: list[int]) -> VarlenLayout:
    """The layout of a row cut at `bounds` (cumulative, from 0 to the row length)."""
    segments = [(bounds[k], bounds[k + 1] - bounds[k]) for k in range(len(bounds) - 1)]
    segments.sort(key=lambda seg: -seg[1])
    gather: list[int] = []
    scatter = [0] * bounds[-1]
    groups: list[tuple[int, int]] = []
    k = 0
    while k < len(segments):
        longest = segments[k][1]
        end = k
        while end < len(segments) and segments[end][1] * GROUP_LENGTH_RATIO >= longest:
            end += 1
        for start, length in segments[k:end]:
            for j in range(longest):
                if j < length:
                    scatter[start + j] = len(gather)
                gather.append(start + min(j, length - 1))
        groups.append((end - k, longest))
        k = end
    return VarlenLayout(torch.tensor(gather), torch.tensor(scatter), tuple(groups))


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
    for count, longest in layout.groups:
        size = count * longest

        def block(t, offset=offset, size=size, count=count, longest=longest):
            return t[:, offset : offset + size].unflatten(1, (count, longest)).transpose(0, 1)

        out = sdpa_attention_forward(module, block(q), block(k), block(v), None, is_causal=True, **kwargs)[0]
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


def block_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """[rows, 1, L, L] bool, True where query q may attend key k: same segment and k <= q.

    Padding (segment -1) attends causally to padding only, so no row of the mask is empty.
    """
    length = segment_ids.shape[-1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment_ids.device).tril()
    return (same & causal)[:, None]


def model_inputs(
    mb: MicroBatch, attn_implementation: str, dtype: torch.dtype, device: torch.device
) -> dict[str, Any]:
    """Keyword arguments of the model's forward for this micro-batch."""
    inputs: dict[str, Any] = {
        "input_ids": mb.input_ids.to(device),
        "position_ids": mb.position_ids.to(device),
        "use_cache": False,
    }
    if not mb.packed:
        inputs["attention_mask"] = mb.attention_mask.to(device)
    elif attn_implementation == "eager":
        allowed = block_causal_mask(mb.segment_ids.to(device))
        # eager adds the mask to the scores: 0 where allowed, the dtype's minimum elsewhere.
        zero = torch.zeros((), dtype=dtype, device=device)
        inputs["attention_mask"] = torch.where(allowed, zero, torch.finfo(dtype).min)
    elif attn_implementation == "sdpa":
        layout = varlen_layout(segment_bounds(mb.segment_ids).tolist())
        inputs[LAYOUT_KWARG] = VarlenLayout(
            layout.gather.to(device), layout.scatter.to(device), layout.groups
        )
    else:
        bounds = segment_bounds(mb.segment_ids)
        longest = int((bounds[1:] - bounds[:-1]).max())
        inputs.update(
            cu_seq_lens_q=bounds.to(device),
            cu_seq_lens_k=bounds.to(device),
            max_length_q=longest,
            max_length_k=longest,
        )
    return inputs
