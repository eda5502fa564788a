"""How a packed row is shown to the attention kernel so that samples never see each other.

transformers 5.23 infers packed samples from position_ids only when no KV cache exists: with
the config's default use_cache=True (train mode included) it creates a DynamicCache and lets a
packed sample silently attend to the samples before it. The trainer therefore never relies on
that inference; it passes the sample boundaries explicitly:

- sdpa (`--attn-implementation sdpa`) runs as `rollway_varlen_sdpa`: torch SDPA once per
  packed sample with is_causal, driven by `cu_seq_lens_q`. That is the varlen math, costs
  O(sum of len^2) instead of O(row^2), and needs no [L, L] mask.
- flash_attention_2 gets the same `cu_seq_lens_*` / `max_length_*` (its native varlen inputs).
- eager gets an explicit block-diagonal causal additive mask built from the segments.

Padded rows (one right-padded sample per row) need no boundaries: under a causal mask a real
token only sees earlier real tokens, and padding outputs carry no loss.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rollway.trainer.micro_batch import MicroBatch

VARLEN_SDPA = "rollway_varlen_sdpa"
VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def varlen_sdpa_forward(module, query, key, value, attention_mask, **kwargs) -> tuple[torch.Tensor, None]:
    """SDPA per segment of `cu_seq_lens_q` ([B=1, heads, L, dim] in, [1, L, heads, dim] out)."""
    bounds = kwargs.pop("cu_seq_lens_q", None)
    for name in VARLEN_KWARGS[1:]:
        kwargs.pop(name, None)
    if bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    bounds = bounds.tolist()
    outputs = [
        sdpa_attention_forward(
            module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None, is_causal=True, **kwargs
        )[0]
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(outputs, dim=1), None


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
