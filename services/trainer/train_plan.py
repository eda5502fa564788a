"""What every rank does in one TrainStep or ComputeLogProbs (computed on rank 0, deterministic).

    items --split_evenly--> num_steps_per_rollout optimizer steps
    each step --packing.plan--> per rank: micro-batches of items (+ empty ones to even out)
              + GlobalDenominators of the step (its samples and loss tokens, over all ranks)

Budget problems become RESOURCE_EXHAUSTED naming the sample, before any rank is involved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollway.common.config import to_dict
from rollway.common.errors import InvalidArgument, ResourceExhausted
from rollway.trainer.attention import shares_prefixes
from rollway.trainer.batch import num_loss_tokens
from rollway.trainer.config import TrainerConfig
from rollway.trainer.loss.losses import GlobalDenominators
from rollway.trainer.micro_batch import SequenceItem, row_tokens
from rollway.trainer.packing import NO_PROMPT, BudgetError, padded_size, plan


@dataclass
class OptimizerStepPlan:
    """One optimizer step as one rank sees it."""

    micro_batches: list[list[SequenceItem]]  # this rank's micro-batches (some may be empty)
    denominators: GlobalDenominators
    settings: dict[str, Any]  # TrainerConfig fields in force for this step
    extra_names: tuple[str, ...] = ()  # per-token inputs of the items (Sample fields, computed ones)


def check_lengths(items: list[SequenceItem], max_tokens: int) -> None:
    """A sample longer than the per-rank token budget can never be trained: RESOURCE_EXHAUSTED."""
    for item in items:
        if len(item) > max_tokens:
            raise ResourceExhausted(
                f"samples[{item.index}]: {len(item)} tokens (prompt + response) exceed "
                f"max_tokens_per_gpu={max_tokens}"
            )


def split_evenly(items: list[SequenceItem], parts: int) -> list[list[SequenceItem]]:
    """`parts` consecutive chunks whose sizes differ by at most one."""
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for k in range(parts):
        end = start + size + (1 if k < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks


def shared_prompts(items: list[SequenceItem], settings: TrainerConfig, packing: bool) -> list | None:
    """(prompt group, prompt length) per item for packing.plan, when packed rows share prefixes:
    the samples of a prompt are planned together (the row's prefix tree may share even more)."""
    if not shares_prefixes(settings, packing):
        return None
    groups: dict[tuple[int, ...], int] = {}
    keys = [tuple(item.token_ids[: item.response_start]) for item in items]
    counts: dict[tuple[int, ...], int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return [
        (groups.setdefault(key, len(groups)), len(key)) if key and counts[key] > 1 else NO_PROMPT
        for key in keys
    ]


def _layout(
    items: list[SequenceItem], world_size: int, settings: TrainerConfig, **overrides
) -> list[list[list[int]]]:
    """The plan of `items`; a group of samples with one prompt is one unit (packing.py)."""
    options = dict(
        max_tokens=settings.max_tokens_per_gpu,
        micro_batch_size=settings.samples_per_micro_batch,
        dynamic=settings.dynamic_batching,
        packing=settings.packing,
        balance=settings.balance_data,
    )
    options.update(overrides)
    prompts = shared_prompts(items, settings, options["packing"])
    try:
        return plan([len(item) for item in items], world_size, prompts=prompts, **options)
    except BudgetError as exc:
        raise ResourceExhausted(str(exc)) from None


def forward_tokens(items: list[SequenceItem], settings: TrainerConfig) -> tuple[int, int]:
    """(real tokens, tokens with padding) of the micro-batch `items` become: a packed row holds
    a shared prefix once (micro_batch.py)."""
    if not settings.packing:
        return sum(map(len, items)), padded_size([len(item) for item in items], False, 1)
    real = row_tokens(items, shares_prefixes(settings, True))
    return real, -(-max(real, 1) // settings.pad_to_multiple) * settings.pad_to_multiple


def plan_train_steps(
    items: list[SequenceItem], settings: TrainerConfig, world_size: int
) -> tuple[list[list[OptimizerStepPlan]], float]:
    """plans[rank][k]: rank's part of optimizer step k; and the packing efficiency of the plan."""
    if len(items) < settings.num_steps_per_rollout:
        raise InvalidArgument(
            "header.num_samples",
            f"{len(items)} samples cannot make num_steps_per_rollout={settings.num_steps_per_rollout} steps",
        )
    check_lengths(items, settings.max_tokens_per_gpu)
    per_rank: list[list[OptimizerStepPlan]] = [[] for _ in range(world_size)]
    real = padded = 0.0
    for chunk in split_evenly(items, settings.num_steps_per_rollout):
        layout = _layout(chunk, world_size, settings)
        for mbs in layout:
            for mb in mbs:
                mb_real, mb_padded = forward_tokens([chunk[i] for i in mb], settings)
                real += mb_real
                padded += mb_padded
        denominators = GlobalDenominators(len(chunk), sum(num_loss_tokens(item) for item in chunk))
        extra_names = tuple(sorted(items[0].extras))  # the same fields for every item (batch.py)
        for rank, mbs in enumerate(layout):
            micro_batches = [[chunk[i] for i in mb] for mb in mbs]
            per_rank[rank].append(
                OptimizerStepPlan(micro_batches, denominators, to_dict(settings), extra_names)
            )
    return per_rank, real / padded


def plan_log_probs(
    items: list[SequenceItem], settings: TrainerConfig, world_size: int
) -> list[list[list[SequenceItem]]]:
    """Per rank, micro-batches for a forward-only pass: packed, by token budget, balanced."""
    check_lengths(items, settings.max_tokens_per_gpu)
    layout = _layout(items, world_size, settings, dynamic=True, packing=True, balance=True)
    return [[[items[i] for i in mb] for mb in mbs] for mbs in layout]
