"""Coordinator-side rollout processing: grouping, dynamic sampling, advantages, metrics."""

import numpy as np
import pytest

from rollway.common.v1 import common_pb2
from rollway.coordinator.evaluation import pass_at_k
from rollway.coordinator.rollout_batch import assign_advantages, group_samples, keep_groups, rollout_metrics


def sample(
    group: int,
    index: int,
    reward: float,
    length: int = 3,
    version: int = 1,
    source: str = "add",
    finish=common_pb2.FINISH_REASON_STOP,
) -> common_pb2.Sample:
    return common_pb2.Sample(
        group_index=group,
        index=index,
        reward=reward,
        raw_reward=reward,
        response_token_ids=list(range(length)),
        weight_version=version,
        source=source,
        finish_reason=finish,
    )


def test_groups_are_ordered_and_zero_std_groups_dropped():
    samples = [sample(1, 3, 1.0), sample(0, 0, 1.0), sample(1, 2, 0.0), sample(0, 1, 1.0)]
    groups = group_samples(samples)
    assert [[s.index for s in g] for g in groups] == [[0, 1], [2, 3]]
    kept, dropped = keep_groups(groups, "check_reward_nonzero_std")
    assert dropped == 1 and [g[0].group_index for g in kept] == [1]
    assert keep_groups(groups, "")[1] == 0
    with pytest.raises(ValueError):
        keep_groups(groups, "nope")


def test_advantages_are_broadcast_to_every_response_token():
    groups = [[sample(0, 0, 1.0, length=2), sample(0, 1, 0.0, length=4)]]
    samples = assign_advantages(groups, "grpo")
    assert len(samples[0].advantages) == 2 and len(samples[1].advantages) == 4
    # rewards 1, 0: mean 0.5, sample std sqrt(0.5) -> +-0.5 / 0.7071 = +-0.7071
    np.testing.assert_allclose(samples[0].advantages, [0.707106] * 2, atol=1e-5)
    np.testing.assert_allclose(samples[1].advantages, [-0.707106] * 4, atol=1e-5)
    dr = assign_advantages(groups, "grpo", disable_grpo_std_normalization=True)
    np.testing.assert_allclose(dr[0].advantages, [0.5, 0.5])
    raw = assign_advantages(groups, "grpo", disable_rewards_normalization=True)
    np.testing.assert_allclose(raw[0].advantages, [1.0, 1.0])


def test_rollout_metrics_use_miles_names():
    samples = [
        sample(0, 0, 1.0, length=2, version=3),
        sample(0, 1, 0.0, length=4, version=2, finish=common_pb2.FINISH_REASON_LENGTH, source="other"),
    ]
    metrics = rollout_metrics(samples, num_dropped_groups=1, group_rewards=[[1, 0], [0, 0], [1, 0], [1, 0]])
    assert metrics["rollout/raw_reward"] == 0.5
    assert metrics["rollout/response_len/mean"] == 3.0
    assert metrics["rollout/truncated_ratio"] == 0.5
    assert metrics["rollout/weight_version/min"] == 2.0
    assert metrics["rollout/zero_std/ratio"] == 0.25
    assert metrics["rollout/raw_reward/other"] == 0.0


def test_zero_std_ratio_counts_every_group_without_reward_variance():
    # No filter, every group all-0 or all-1: nothing was dropped, yet no group has a GRPO signal.
    samples = [sample(g, i, float(g % 2), length=2, version=1) for g in range(4) for i in range(2)]
    metrics = rollout_metrics(samples)
    assert metrics["rollout/zero_std/ratio"] == 1.0
    assert metrics["rollout/zero_std/count_0.0"] == 2.0 and metrics["rollout/zero_std/count_1.0"] == 2.0
    assert metrics["rollout/zero_std/dropped_groups"] == 0.0
    # With a filter: the dropped groups count too (the kept ones all have variance).
    kept = [sample(0, 0, 1.0, length=2, version=1), sample(0, 1, 0.0, length=2, version=1)]
    filtered = rollout_metrics(kept, num_dropped_groups=3, group_rewards=[[1, 0], [1, 1], [0, 0], [0, 0]])
    assert filtered["rollout/zero_std/ratio"] == 0.75 and filtered["rollout/zero_std/count_0.0"] == 2.0
    assert "rollout/zero_std/count_1.0" in filtered and filtered["rollout/zero_std/dropped_groups"] == 3.0


def test_pass_at_k():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - (2 / 4) * (1 / 3))


def test_environment_metrics_are_averaged_over_the_samples_that_report_them():
    samples = [sample(0, 0, 1.0), sample(0, 1, 0.0), sample(1, 2, 1.0)]
    samples[0].metrics.update({"correct": 1.0, "num_turns": 2.0})
    samples[1].metrics.update({"correct": 0.0, "num_turns": 4.0})
    samples[2].metrics.update({"correct": 1.0})  # reports no num_turns: not counted as 0
    metrics = rollout_metrics(samples)
    assert metrics["rollout/env/correct"] == pytest.approx(2 / 3)
    assert metrics["rollout/env/num_turns"] == pytest.approx(3.0)
    assert not any(k.startswith("rollout/env/") for k in rollout_metrics([sample(0, 0, 1.0)]))
