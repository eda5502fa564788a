"""What every rank does in one TrainStep or ComputeLogProbs (computed on rank 0, deterministic).

    items --split_evenly--> num_steps_per_rollout optimizer steps
    each step --packing.plan--> per rank: micro-batches of items (+ empty ones to even out)
              + GlobalDenominators of the step (its samples and loss tokens, over all ranks)

Budget problems become RESOURCE_EXHAUSTED naming the sample, before any rank is involved.
"""

from __future__ import annotations

from rollway.common.config import to_dict
from rollway.common.errors import InvalidArgument, ResourceExhausted
from rollway.trainer.batch import num_loss_tokens
from rollway.trainer.config import TrainerConfig
from rollway.trainer.engine import OptimizerStepPlan
from rollway.trainer.losses import GlobalDenominators
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.packing import BudgetError, packing_efficiency, plan


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


def _layout(
    lengths: list[int], world_size: int, settings: TrainerConfig, **overrides
) -> list[list[list[int]]]:
    options = dict(
        max_tokens=settings.max_tokens_per_gpu,
        micro_batch_size=settings.samples_per_micro_batch,
        dynamic=settings.dynamic_batching,
        packing=settings.packing,
        balance=settings.balance_data,
    )
    options.update(overrides)
    try:
        return plan(lengths, world_size, **options)
    except BudgetError as exc:
        raise ResourceExhausted(str(exc)) from None


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
        lengths = [len(item) for item in chunk]
        layout = _layout(lengths, world_size, settings)
        efficiency = packing_efficiency(layout, lengths, settings.packing, settings.pad_to_multiple)
        real += sum(lengths)
        padded += sum(lengths) / efficiency
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
    lengths = [len(item) for item in items]
    layout = _layout(lengths, world_size, settings, dynamic=True, packing=True, balance=True)
    return [[[items[i] for i in mb] for mb in mbs] for mbs in layout]
