"""Micro-batch planning: balance across ranks, token budgets, equal micro-batch counts."""

from __future__ import annotations

import pytest

from rollway.trainer.packing import (
    NO_PROMPT,
    BudgetError,
    batch_cost,
    micro_batches,
    packing_efficiency,
    padded_size,
    plan,
    prompt_units,
    split_for_ranks,
)


def test_split_for_ranks_balances_tokens_with_greedy_lpt():
    lengths = [50, 10, 40, 30, 20, 20]
    parts = split_for_ranks(lengths, 2, balance=True)
    assert sorted(i for part in parts for i in part) == list(range(6))
    assert [sum(lengths[i] for i in part) for part in parts] == [80, 90] or [
        sum(lengths[i] for i in part) for part in parts
    ] == [90, 80]
    assert split_for_ranks(lengths, 2, balance=False) == [[0, 2, 4], [1, 3, 5]]


def test_dynamic_micro_batches_fill_the_token_budget():
    lengths = [30, 30, 20, 20, 10, 50]
    groups = micro_batches(range(6), lengths, max_tokens=60, micro_batch_size=1, dynamic=True, packing=True)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(batch_cost([lengths[i] for i in g], True) <= 60 for g in groups)
    assert len(groups) == 3  # 160 tokens need at least 3 bins of 60
    lengths = [40, 10, 10, 10]
    packed = micro_batches(range(4), lengths, max_tokens=70, micro_batch_size=1, dynamic=True, packing=True)
    padded = micro_batches(range(4), lengths, max_tokens=70, micro_batch_size=1, dynamic=True, packing=False)
    assert packed == [[0, 1, 2, 3]]
    assert padded == [[0], [1, 2, 3]]  # padded to the longest, 40 + 10 would cost 80 tokens


def test_fixed_micro_batches_and_budget_errors():
    lengths = [5, 6, 7, 8, 9]
    assert micro_batches(
        range(5), lengths, max_tokens=100, micro_batch_size=2, dynamic=False, packing=True
    ) == [
        [0, 1],
        [2, 3],
        [4],
    ]
    with pytest.raises(BudgetError, match="sample 4 has 9 tokens, over max_tokens_per_gpu=8"):
        micro_batches(range(5), lengths, max_tokens=8, micro_batch_size=1, dynamic=True, packing=True)
    with pytest.raises(BudgetError, match="micro_batch_size=2"):
        micro_batches(range(5), lengths, max_tokens=12, micro_batch_size=2, dynamic=False, packing=True)


def test_plan_gives_every_rank_the_same_number_of_micro_batches():
    lengths = [100, 5, 5, 5]
    layout = plan(lengths, 2, max_tokens=100, micro_batch_size=1, dynamic=True, packing=True, balance=True)
    assert [len(mbs) for mbs in layout] == [1, 1]
    layout = plan(lengths, 3, max_tokens=100, micro_batch_size=1, dynamic=False, packing=True, balance=True)
    assert len({len(mbs) for mbs in layout}) == 1
    assert sorted(i for mbs in layout for mb in mbs for i in mb) == [0, 1, 2, 3]
    assert sum(1 for mbs in layout for mb in mbs if not mb) >= 1  # padded with empty micro-batches


def test_packing_efficiency_counts_padding():
    lengths = [10, 20, 30]
    packed = plan(lengths, 1, max_tokens=100, micro_batch_size=3, dynamic=False, packing=True, balance=True)
    padded = plan(lengths, 1, max_tokens=100, micro_batch_size=3, dynamic=False, packing=False, balance=True)
    assert packing_efficiency(packed, lengths, True, 16) == pytest.approx(60 / 64)
    assert packing_efficiency(padded, lengths, False, 16) == pytest.approx(60 / 90)
    assert padded_size([], True, 16) == 16


def test_samples_sharing_a_prompt_are_one_unit_that_costs_the_prompt_once():
    # Samples 0, 2, 3 share a 10-token prompt (group 5), sample 1 shares nothing.
    lengths = [14, 20, 12, 16]
    prompts = [(5, 10), NO_PROMPT, (5, 10), (5, 10)]
    units, costs = prompt_units(lengths, prompts, max_tokens=100)
    assert units == [[0, 2, 3], [1]] and costs == [10 + 4 + 2 + 6, 20]
    # A unit that does not fit is cut; a lone member costs its full length.
    units, costs = prompt_units(lengths, prompts, max_tokens=17)
    assert units == [[0, 2], [3], [1]] and costs == [16, 16, 20]
    layout = plan(
        lengths,
        2,
        max_tokens=40,
        micro_batch_size=1,
        dynamic=True,
        packing=True,
        balance=True,
        prompts=prompts,
    )
    assert sorted(map(sorted, (mb for rank in layout for mb in rank))) == [[0, 2, 3], [1]]
    with pytest.raises(BudgetError, match="sample 1 has 20 tokens"):
        plan(
            lengths,
            1,
            max_tokens=19,
            micro_batch_size=1,
            dynamic=True,
            packing=True,
            balance=True,
            prompts=prompts,
        )
