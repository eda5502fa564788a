"""Per-source loss of a step (train/loss/<source>) when the samples come from several sources.

Each sample lies inside one micro-batch on one rank, so its loss sum and loss-token count are
exact locally; rank 0 gathers them and aggregates per source the way the step's loss is
aggregated: the mean over the source's samples of each sample's token mean (default), or the
source's token sum over its loss tokens (--calculate-per-token-loss). The split into ranks and
micro-batches does not change the result.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rollway.trainer.micro_batch import SequenceItem


def sample_sums(
    term: torch.Tensor, loss_mask: torch.Tensor, sample_index: torch.Tensor
) -> dict[int, list[float]]:
    """Sample index -> [sum of `term` over its loss tokens, number of loss tokens]."""
    valid = sample_index >= 0
    if not bool(valid.any()):
        return {}
    index = sample_index[valid]
    masked = (term.detach() * loss_mask)[valid].double()
    ids, inverse = torch.unique(index, return_inverse=True)
    sums = torch.zeros(len(ids), dtype=torch.float64).scatter_add_(0, inverse.cpu(), masked.cpu())
    counts = torch.zeros(len(ids), dtype=torch.float64).scatter_add_(
        0, inverse.cpu(), loss_mask[valid].double().cpu()
    )
    return {int(i): [s, c] for i, s, c in zip(ids.tolist(), sums.tolist(), counts.tolist(), strict=True)}


def source_losses(
    per_sample: dict[int, list[float]], sources: dict[int, str], per_token: bool
) -> dict[str, float]:
    """{"train/loss/<source>": value} when there are at least two sources, else {}."""
    if len(set(sources.values())) < 2:
        return {}
    numerators: dict[str, float] = {}
    denominators: dict[str, float] = {}
    for index, (total, count) in per_sample.items():
        source = sources[index]
        numerators[source] = numerators.get(source, 0.0) + (total if per_token else total / max(count, 1.0))
        denominators[source] = denominators.get(source, 0.0) + (count if per_token else 1.0)
    return {f"train/loss/{s}": numerators[s] / max(denominators[s], 1.0) for s in sorted(numerators)}


def gather_source_losses(
    per_sample: dict[int, list[float]], micro_batches: list[list[SequenceItem]], per_token: bool
) -> dict[str, float]:
    """Every rank: send its samples' sums to rank 0, which returns the per-source losses."""
    sources = {item.index: item.source for items in micro_batches for item in items}
    local: Any = (per_sample, sources)
    world = dist.get_world_size() if dist.is_initialized() else 1
    gathered: list[Any] | None = [None] * world if not dist.is_initialized() or dist.get_rank() == 0 else None
    if dist.is_initialized():
        dist.gather_object(local, gathered, dst=0)
    else:
        gathered = [local]
    if gathered is None:
        return {}
    all_sums = {k: v for sums, _ in gathered for k, v in sums.items()}
    all_sources = {k: v for _, srcs in gathered for k, v in srcs.items()}
    return source_losses(all_sums, all_sources, per_token)
