"""The dashboard's rollout sample store: what it keeps per step, how it is bounded, what a record holds."""

from __future__ import annotations

import pytest
from support.waiting import wait_until

from rollway.common.v1 import common_pb2
from rollway.coordinator.dashboard import rollout_samples


def make_samples(num_groups: int, per_group: int = 2) -> list[common_pb2.Sample]:
    samples = []
    for g in range(num_groups):
        for i in range(per_group):
            samples.append(
                common_pb2.Sample(
                    group_index=10 + g,
                    index=g * per_group + i,
                    prompt_token_ids=[1, 2],
                    response_token_ids=[5, 6, 7],
                    rollout_log_probs=[-0.123456789, -1.5, -2.25],
                    advantages=[0.5, 0.5, 0.5],
                    reward=float(i),
                    finish_reason=common_pb2.FINISH_REASON_LENGTH,
                    weight_version=3,
                )
            )
    return samples


def test_first_groups_keeps_whole_groups_in_batch_order():
    samples = make_samples(5)
    kept = rollout_samples.first_groups(samples, 2)
    assert [s.group_index for s in kept] == [10, 10, 11, 11]
    assert len(rollout_samples.first_groups(samples, 0)) == 10  # 0: every group


def test_sample_record_holds_per_token_values_and_their_difference():
    sample = make_samples(1)[0]
    record = rollout_samples.sample_record(sample, [-0.1, -1.6, -2.0], [0.9, 1.1, 1.2])
    assert record["rollout_log_probs"] == [-0.12346, -1.5, -2.25]
    assert record["train_rollout_log_prob_diff"] == pytest.approx([0.02346, -0.1, 0.25])
    assert record["entropy"] == [0.9, 1.1, 1.2]
    assert (record["advantage"], record["weight_version"], record["finish_reason"]) == (0.5, 3, "LENGTH")
    assert "trainer_log_probs" not in rollout_samples.sample_record(sample)  # none given, none stored


def test_store_writes_steps_and_keeps_only_the_newest(tmp_path):
    store = rollout_samples.RolloutSampleStore(tmp_path, max_groups=2, keep_steps=3)
    for step in range(5):
        records = [rollout_samples.sample_record(s) for s in rollout_samples.first_groups(make_samples(4), 2)]
        assert store.record(step, records)
        wait_until(lambda s=step: s in rollout_samples.stored_steps(tmp_path), 5.0, f"step {step} written")
    store.close()
    assert rollout_samples.stored_steps(tmp_path) == [2, 3, 4]
    stored = rollout_samples.read_step(tmp_path, 4)
    assert [r["group_index"] for r in stored] == [10, 10, 11, 11]
    with pytest.raises(FileNotFoundError):
        rollout_samples.read_step(tmp_path, 0)


def test_a_writer_that_lags_drops_steps_instead_of_blocking_the_run(tmp_path):
    store = rollout_samples.RolloutSampleStore(tmp_path, max_groups=1, keep_steps=0)
    (tmp_path / "rollouts").write_text("not a directory")  # every write fails: the writer keeps going
    accepted = [store.record(step, [{"x": step}]) for step in range(50)]
    store.close()
    assert all(accepted[: rollout_samples.QUEUE_STEPS])  # the queue never blocks: extra steps are dropped
    assert store.num_dropped_steps == accepted.count(False)
