"""GroupCollector: samples arrive interleaved across groups; complete groups are filtered at once."""

from unit.coordinator.test_rollout_batch import sample

from rollway.common.v1 import common_pb2
from rollway.coordinator.rollout_collect import GroupCollector


def test_complete_groups_are_filtered_as_they_arrive_and_the_batch_is_in_group_order():
    groups = GroupCollector(2, "check_reward_nonzero_std")
    groups.wanted = 2
    arrivals = [
        sample(7, 0, 1.0),
        sample(3, 1, 1.0),
        sample(3, 0, 1.0),  # group 3 complete: both rewards 1 -> dropped
        sample(9, 1, 0.0),
        sample(7, 1, 0.0),  # group 7 complete: kept (1 of 2 wanted)
    ]
    assert [groups.add(s) for s in arrivals] == [False] * 5
    assert (len(groups.kept), groups.num_dropped, groups.num_complete) == (1, 1, 2)
    assert groups.add(sample(9, 0, 1.0))  # group 9 complete: the second kept group -> enough
    assert groups.add(sample(5, 0, 1.0)) and groups.num_complete == 3  # stays True; group 5 still open
    batch = groups.batch(2)
    assert [g[0].group_index for g in batch] == [7, 9]  # group order, not arrival order
    assert [[s.index for s in g] for g in batch] == [[0, 1], [0, 1]]
    assert [g[0].group_index for g in groups.batch(1)] == [7]
    # Every scored group's rewards, the dropped one's included (rollout/zero_std/* counts them).
    assert groups.group_rewards == [[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]


def test_without_a_filter_every_group_is_kept_and_generation_never_stops_early():
    groups = GroupCollector(2, "")
    flags = [groups.add(sample(g, i, 1.0)) for g in (1, 0) for i in (1, 0)]
    assert flags == [False] * 4 and groups.num_dropped == 0
    assert [g[0].group_index for g in groups.batch(5)] == [0, 1]


def test_a_group_with_an_aborted_sample_is_set_aside_not_filtered():
    groups = GroupCollector(2, "check_reward_nonzero_std")
    groups.add(sample(4, 1, 0.0, finish=common_pb2.FINISH_REASON_ABORT))
    groups.add(sample(4, 0, 1.0))
    assert groups.kept == [] and groups.num_dropped == 0 and groups.num_complete == 0
    assert [[s.index for s in g] for g in groups.partial] == [[0, 1]]


def test_a_sample_failed_before_its_first_turn_gets_one_masked_token():
    """An environment unreachable at Reset fails the sample with no response; the trainer takes
    no empty response, so it gets one filler token (loss mask 0, log-prob 0.0) and keeps its place."""
    groups = GroupCollector(2, "")
    failed = common_pb2.Sample(
        group_index=0, index=0, prompt_token_ids=[1, 2], finish_reason=common_pb2.FINISH_REASON_FAILED
    )
    mid_episode = common_pb2.Sample(
        group_index=0,
        index=1,
        prompt_token_ids=[1, 2],
        response_token_ids=[7, 8],
        loss_mask=[1, 1],
        rollout_log_probs=[-0.5, -0.25],
        finish_reason=common_pb2.FINISH_REASON_FAILED,
    )
    groups.add(failed)
    groups.add(mid_episode)
    [group] = groups.kept
    by_index = {s.index: s for s in group}
    assert list(by_index[0].response_token_ids) == [0] and list(by_index[0].loss_mask) == [0]
    assert list(by_index[0].rollout_log_probs) == [0.0]
    assert list(by_index[1].response_token_ids) == [7, 8] and list(by_index[1].loss_mask) == [0, 0]
    assert list(by_index[1].rollout_log_probs) == [-0.5, -0.25]
