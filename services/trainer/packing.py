"""Which samples go to which rank and micro-batch (pure planning; no tensors).

    samples --(split_for_ranks: balanced by tokens)--> rank 0 | rank 1 | ...
    each rank --(micro_batches: token budget or fixed count)--> mb 0, mb 1, ...
    plan(): every rank gets the same number of micro-batches; short ranks get empty ones
            (FSDP2 needs the same collectives on every rank; an empty one carries zero loss).

Costs are tokens a micro-batch occupies: the sum of sample lengths when packed, the longest
sample times the number of samples when padded. Every micro-batch stays within the budget.

Shared prompts (`prompts`, packed rows with a token budget): samples with the same prompt (a
GRPO group) are planned as one unit that costs the prompt once plus the responses - the row
the micro-batch becomes (micro_batch.py) - cut into several units where one would not fit.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class BudgetError(ValueError):
    """A sample or micro-batch does not fit the token budget (`max_tokens_per_gpu`)."""


def batch_cost(lengths: Sequence[int], packing: bool) -> int:
    """Tokens a micro-batch of samples with these lengths occupies (before the final pad)."""
    if not lengths:
        return 0
    return sum(lengths) if packing else max(lengths) * len(lengths)


def split_for_ranks(lengths: Sequence[int], world_size: int, balance: bool) -> list[list[int]]:
    """Sample indices per rank. Balanced: longest first, each to the rank with the fewest tokens
    (ties: fewest samples), the greedy LPT partition. Otherwise round-robin."""
    if not balance:
        return [list(range(rank, len(lengths), world_size)) for rank in range(world_size)]
    heap = [(0, 0, rank) for rank in range(world_size)]
    parts: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tokens, count, rank = heapq.heappop(heap)
        parts[rank].append(index)
        heapq.heappush(heap, (tokens + lengths[index], count + 1, rank))
    return [sorted(part) for part in parts]


def micro_batches(
    indices: Sequence[int],
    lengths: Sequence[int],
    *,
    max_tokens: int,
    micro_batch_size: int,
    dynamic: bool,
    packing: bool,
) -> list[list[int]]:
    """Group one rank's samples into micro-batches within `max_tokens`.

    dynamic: first-fit decreasing by length into bins of `max_tokens` (fewest micro-batches);
    fixed: consecutive groups of `micro_batch_size`, each checked against the budget.
    """
    for index in indices:
        if lengths[index] > max_tokens:
            raise BudgetError(
                f"sample {index} has {lengths[index]} tokens, over max_tokens_per_gpu={max_tokens}"
            )
    if not dynamic:
        groups = [list(indices[i : i + micro_batch_size]) for i in range(0, len(indices), micro_batch_size)]
        for group in groups:
            cost = batch_cost([lengths[i] for i in group], packing)
            if cost > max_tokens:
                raise BudgetError(
                    f"a micro-batch of {len(group)} samples (micro_batch_size={micro_batch_size}) needs "
                    f"{cost} tokens, over max_tokens_per_gpu={max_tokens}"
                )
        return groups
    bins: list[list[int]] = []
    for index in sorted(indices, key=lambda i: (-lengths[i], i)):
        for group in bins:
            if batch_cost([lengths[i] for i in [*group, index]], packing) <= max_tokens:
                group.append(index)
                break
        else:
            bins.append([index])
    return [sorted(group) for group in bins]


NO_PROMPT = (-1, 0)  # a sample that shares its prompt with no other


def prompt_units(
    lengths: Sequence[int], prompts: Sequence[tuple[int, int]], max_tokens: int
) -> tuple[list[list[int]], list[int]]:
    """Units of samples that share a prompt and their row costs (the prompt once), each within
    `max_tokens`. prompts[i] = (prompt group, prompt length), group -1 for none."""
    groups: list[list[int]] = []
    by_group: dict[int, list[int]] = {}
    for index, (group, _) in enumerate(prompts):
        if group < 0:
            groups.append([index])
        elif group in by_group:
            by_group[group].append(index)
        else:
            by_group[group] = [index]
            groups.append(by_group[group])
    units: list[list[int]] = []
    costs: list[int] = []
    for members in groups:
        prompt = prompts[members[0]][1] if len(members) > 1 else 0
        unit, cost = [], prompt
        for index in members:
            if unit and cost + lengths[index] - prompt > max_tokens:
                units.append(unit)
                costs.append(cost if len(unit) > 1 else lengths[unit[0]])
                unit, cost = [], prompt
            unit.append(index)
            cost += lengths[index] - prompt
        units.append(unit)
        costs.append(cost if len(unit) > 1 else lengths[unit[0]])
    return units, costs


def plan(
    lengths: Sequence[int],
    world_size: int,
    *,
    max_tokens: int,
    micro_batch_size: int,
    dynamic: bool,
    packing: bool,
    balance: bool,
    prompts: Sequence[tuple[int, int]] | None = None,
) -> list[list[list[int]]]:
    """plan[rank][k] = sample indices of rank `rank`'s k-th micro-batch; same k count on every rank.

    `prompts` (packed, dynamic): samples that share a prompt go together (prompt_units)."""
    if prompts is not None and packing and dynamic:
        for index, length in enumerate(lengths):
            if length > max_tokens:
                raise BudgetError(f"sample {index} has {length} tokens, over max_tokens_per_gpu={max_tokens}")
        units, costs = prompt_units(lengths, prompts, max_tokens)
        unit_plan = plan(
            costs,
            world_size,
            max_tokens=max_tokens,
            micro_batch_size=micro_batch_size,
            dynamic=True,
            packing=True,
            balance=balance,
        )
        return [[sorted(i for u in mb for i in units[u]) for mb in mbs] for mbs in unit_plan]
    per_rank = [
        micro_batches(
            part,
            lengths,
            max_tokens=max_tokens,
            micro_batch_size=micro_batch_size,
            dynamic=dynamic,
            packing=packing,
        )
        for part in split_for_ranks(lengths, world_size, balance)
    ]
    num = max(1, max(len(mbs) for mbs in per_rank))
    return [mbs + [[] for _ in range(num - len(mbs))] for mbs in per_rank]


def packing_efficiency(
    plan_: list[list[list[int]]], lengths: Sequence[int], packing: bool, pad_multiple: int
) -> float:
    """Share of real tokens among the tokens the forward passes process (1.0 = no padding)."""
    real = sum(lengths[i] for rank in plan_ for mb in rank for i in mb)
    total = 0
    for rank in plan_:
        for mb in rank:
            mb_lengths = [lengths[i] for i in mb]
            total += padded_size(mb_lengths, packing, pad_multiple)
    return real / total if total else 1.0


def padded_size(mb_lengths: Sequence[int], packing: bool, pad_multiple: int) -> int:
    """Tokens of the tensor a micro-batch becomes: packed rows round up to `pad_multiple`."""
    if not mb_lengths:
        return pad_multiple
    if packing:
        return -(-sum(mb_lengths) // pad_multiple) * pad_multiple
    return max(mb_lengths) * len(mb_lengths)
