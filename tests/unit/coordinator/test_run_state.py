"""Run checkpoints: atomic, latest-complete lookup, RNG round trip; debug rollout dumps."""

import random

import numpy as np
import pytest

from rollway.common.errors import NotFound
from rollway.common.v1 import common_pb2
from rollway.coordinator import debug_data, run_state
from rollway.coordinator.run_state import RunState


def test_checkpoint_round_trip_and_latest(tmp_path):
    state = RunState(next_rollout_id=3, next_batch_id=5, weight_version=4, tokens_seen=99)
    run_state.write_checkpoint(run_state.checkpoint_dir(tmp_path, 3), state, '{"cursor": 1}')
    random.seed(7)
    np.random.seed(7)
    expected = (random.random(), np.random.rand())
    random.seed(7)
    np.random.seed(7)
    run_state.write_checkpoint(run_state.checkpoint_dir(tmp_path, 6), RunState(next_rollout_id=6), None)
    # a save killed half-way: trainer files but no coordinator.json
    (run_state.checkpoint_dir(tmp_path, 9) / "trainer").mkdir(parents=True)
    found = run_state.find_checkpoint(tmp_path)
    assert found.name == "rollout_0000006"
    restored, cursor = run_state.read_checkpoint(found)
    assert restored.next_rollout_id == 6 and cursor is None
    random.seed(1)
    np.random.seed(1)
    restored.restore_rng()
    assert (random.random(), np.random.rand()) == expected
    first, cursor = run_state.read_checkpoint(run_state.checkpoint_dir(tmp_path, 3))
    assert (first.next_batch_id, first.weight_version, cursor) == (5, 4, '{"cursor": 1}')
    assert run_state.find_checkpoint(tmp_path / "missing") is None


def test_debug_rollout_dump_is_bit_exact(tmp_path):
    samples = [
        common_pb2.Sample(
            group_index=1,
            index=2,
            response_token_ids=[5, 6],
            rollout_log_probs=[-0.1234567, -2.5],
            advantages=[0.3, 0.3],
            reward=1.0,
            weight_version=7,
        )
    ]
    template = str(tmp_path / "dump_{rollout_id}.pb")
    path = debug_data.save_rollout(template, 4, samples)
    assert path.name == "dump_4.pb"
    assert debug_data.load_rollout(template, 4) == samples
    assert debug_data.rollout_path(str(tmp_path), 2).name == "rollout_2.pb"
    with pytest.raises(NotFound, match="no dump for rollout 5"):
        debug_data.load_rollout(template, 5)
