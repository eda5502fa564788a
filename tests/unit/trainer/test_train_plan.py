"""Planning a TrainStep on rank 0: optimizer steps, per-rank micro-batches, global denominators."""

from __future__ import annotations

import pytest

from rollway.common.errors import InvalidArgument, ResourceExhausted
from rollway.trainer.config import TrainerConfig
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.train_plan import plan_log_probs, plan_train_steps, split_evenly


def items(lengths: list[int], prompt: int = 1) -> list[SequenceItem]:
    return [SequenceItem(i, list(range(3, 3 + n)), prompt, [1] * (n - prompt)) for i, n in enumerate(lengths)]


def settings(**kw) -> TrainerConfig:
    return TrainerConfig(hf_checkpoint="m", **kw)


def test_split_evenly_keeps_order_and_sizes_within_one():
    chunks = split_evenly(items([2] * 7), 3)
    assert [[it.index for it in c] for c in chunks] == [[0, 1, 2], [3, 4], [5, 6]]


def test_each_optimizer_step_has_its_own_global_denominators():
    batch = items([4, 6, 8, 10, 12, 14])
    per_rank, efficiency = plan_train_steps(batch, settings(num_steps_per_rollout=2, micro_batch_size=2), 2)
    assert len(per_rank) == 2 and all(len(steps) == 2 for steps in per_rank)
    first, second = per_rank[0]
    assert (first.denominators.num_samples, first.denominators.num_loss_tokens) == (3, 3 + 5 + 7)
    assert (second.denominators.num_samples, second.denominators.num_loss_tokens) == (3, 9 + 11 + 13)
    for k in range(2):  # same micro-batch count on both ranks; every sample exactly once
        assert len(per_rank[0][k].micro_batches) == len(per_rank[1][k].micro_batches)
        seen = sorted(it.index for rank in per_rank for mb in rank[k].micro_batches for it in mb)
        assert seen == ([0, 1, 2] if k == 0 else [3, 4, 5])
    assert 0 < efficiency <= 1


def test_planning_errors_name_the_sample_or_header():
    with pytest.raises(ResourceExhausted, match=r"samples\[1\]: 20 tokens .* exceed max_tokens_per_gpu=16"):
        plan_train_steps(items([4, 20]), settings(max_tokens_per_gpu=16), 1)
    with pytest.raises(ResourceExhausted, match="micro_batch_size=2"):
        plan_train_steps(items([10, 10]), settings(max_tokens_per_gpu=16, micro_batch_size=2), 1)
    with pytest.raises(
        InvalidArgument, match="header.num_samples: 1 samples cannot make num_steps_per_rollout=2"
    ):
        plan_train_steps(items([4]), settings(num_steps_per_rollout=2), 1)


def test_log_prob_plan_packs_by_token_budget_on_every_rank():
    layout = plan_log_probs(items([5, 5, 5, 5, 5]), settings(max_tokens_per_gpu=10), 2)
    assert len(layout[0]) == len(layout[1])
    assert sorted(it.index for rank in layout for mb in rank for it in mb) == [0, 1, 2, 3, 4]
    assert all(sum(len(it) for it in mb) <= 10 for rank in layout for mb in rank)
