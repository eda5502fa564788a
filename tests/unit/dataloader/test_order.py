"""Row order: epochs, seeded shuffles, weighted mixing, and cursors that resume exactly."""

from collections import Counter

import numpy as np
import pytest

from rollway.dataloader.order import ConcatOrder, WeightedOrder, make_order


def drain(order, n=None):
    draws = []
    while n is None or len(draws) < n:
        draw = order.next()
        if draw is None:
            break
        draws.append((draw.source, draw.position, draw.epoch))
    return draws


def test_concat_order_visits_every_row_once_per_epoch():
    draws = drain(ConcatOrder([3, 5], seed=1, shuffle=True, num_epoch=2))
    assert len(draws) == 16
    for epoch in (0, 1):
        rows = sorted((s, p) for s, p, e in draws if e == epoch)
        assert rows == [(0, p) for p in range(3)] + [(1, p) for p in range(5)]
    assert draws[:8] != draws[8:]  # each epoch has its own permutation


def test_without_shuffle_rows_come_in_file_order():
    assert drain(ConcatOrder([2, 1], seed=1, shuffle=False, num_epoch=1)) == [(0, 0, 0), (0, 1, 0), (1, 0, 0)]


def test_shuffle_is_a_function_of_seed_and_epoch():
    a = drain(ConcatOrder([50], seed=7, shuffle=True, num_epoch=2))
    assert a == drain(ConcatOrder([50], seed=7, shuffle=True, num_epoch=2))
    assert a != drain(ConcatOrder([50], seed=8, shuffle=True, num_epoch=2))


@pytest.mark.parametrize("cut", [0, 5, 19, 20, 21, 39])
@pytest.mark.parametrize("weights", [None, [0.25, 0.75]])
def test_restored_cursor_continues_the_uninterrupted_order(cut, weights):
    """Mid-epoch and exactly at the epoch boundary (cut 20 = one epoch of 8 + 12 rows)."""
    full = drain(make_order([8, 12], weights, seed=3, shuffle=True, num_epoch=3))
    first = make_order([8, 12], weights, seed=3, shuffle=True, num_epoch=3)
    drain(first, cut)
    resumed = make_order([8, 12], weights, seed=3, shuffle=True, num_epoch=3)
    resumed.restore(first.state())
    assert drain(resumed) == full[cut:]


def test_weighted_order_mix_matches_the_weights():
    order = WeightedOrder([100, 40, 10], [0.5, 0.3, 0.2], seed=0, shuffle=True, num_epoch=0)
    for n, tolerance in ((100, 0.05), (500, 0.02), (128 * 40, 0.005)):
        counts = Counter(s for s, _, _ in drain(order, n))
        observed = np.array([counts[s] for s in range(3)]) / n
        assert np.abs(observed - [0.5, 0.3, 0.2]).max() < tolerance, (n, observed)


def test_weighted_sources_wrap_into_their_own_epochs():
    order = WeightedOrder([4, 6], [0.5, 0.5], seed=0, shuffle=True, num_epoch=0)
    draws = drain(order, 200)
    small = [(p, e) for s, p, e in draws if s == 0]
    for epoch in range(max(e for _, e in small)):
        assert sorted(p for p, e in small if e == epoch) == [0, 1, 2, 3]


def test_weighted_order_ends_after_num_epoch_times_all_rows():
    order = WeightedOrder([3, 7], [0.9, 0.1], seed=0, shuffle=False, num_epoch=2)
    assert len(drain(order)) == 20
    assert order.finished(order.state()) and order.epoch_of(order.state()) == 2


def test_a_zero_weight_source_is_never_drawn():
    order = WeightedOrder([5, 5], [1.0, 0.0], seed=0, shuffle=False, num_epoch=0)
    assert {s for s, _, _ in drain(order, 2000)} == {0}


@pytest.mark.parametrize(
    "state", [{"epoch": -1, "offset": 0}, {"epoch": 0, "offset": 20}, {"epoch": "0", "offset": 0}, {}]
)
def test_bad_cursors_are_refused(state):
    with pytest.raises(ValueError):
        ConcatOrder([8, 12], seed=0, shuffle=True, num_epoch=1).restore(state)
    with pytest.raises(ValueError):
        WeightedOrder([8, 12], [1, 1], seed=0, shuffle=True, num_epoch=1).restore(
            {"draws": 0, "sources": [[0, 12], [0, 0]]}
        )
