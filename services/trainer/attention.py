"""How a packed row is shown to the attention kernel so that samples never see each other.

flash_attention_2 finds sample boundaries from position_ids alone (the varlen path). For eager
and sdpa the trainer builds the block-diagonal causal mask itself. transformers 5.23 would infer
it from position_ids too, but only when no KV cache exists: with the config's default
use_cache=True (train mode included) it creates a DynamicCache and silently lets a packed
sample attend to the samples before it. An explicit 4D mask does not depend on that.
"""

from __future__ import annotations

from typing import Any

import torch

from rollway.trainer.micro_batch import MicroBatch


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
    elif attn_implementation != "flash_attention_2":
        allowed = block_causal_mask(mb.segment_ids.to(device))
        if attn_implementation == "eager":
            # eager adds the mask to the scores: 0 where allowed, the dtype's minimum elsewhere.
            zero = torch.zeros((), dtype=dtype, device=device)
            inputs["attention_mask"] = torch.where(allowed, zero, torch.finfo(dtype).min)
        else:
            inputs["attention_mask"] = allowed
    return inputs
