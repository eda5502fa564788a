"""--partial-rollout over a real dataloader and a real rollout service (coordinator code in process).

The rollout service decodes one sample at a time (--max-running-requests 1), so samples are
generated in submission order and, when a refill has enough groups, the later ones are aborted
mid-way or before their first token. The reward gives 0 and 1 by the sample's position in its
request, except in group 1 (all 0: dropped), so rollout 0 keeps groups 0 and 2 out of a refill of
2..5 and carries the aborted rest over; rollout 1 continues the carried groups first.
"""

from __future__ import annotations

import os

import pytest
from support.processes import ServiceProcess

from rollway.common.config import from_dict
from rollway.common.v1 import common_pb2
from rollway.coordinator import run_state
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.remote import Services
from rollway.coordinator.rollout_collect import collect_rollout, decode_sample
from rollway.coordinator.run_state import RunState

ABORT = common_pb2.FINISH_REASON_ABORT
REWARD_MODULE = """
def alternate(sample):
    # Group 1: both samples 0 (dropped by the zero-std filter); others: 0 and 1 by sample position.
    return 0.0 if sample.group_index == 1 else float(sample.index % 2)
"""


@pytest.fixture(scope="module")
def services(tiny_model_dir, demo_data_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("partial")
    (workdir / "alternate_reward.py").write_text(REWARD_MODULE)
    env = {"PYTHONPATH": str(workdir) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    dataloader_args = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(demo_data_dir / "rl.parquet"),
                       "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--num-epoch", "0"]  # fmt: skip
    rollout_args = ["--hf-checkpoint", str(tiny_model_dir), "--custom-rm-path", "alternate_reward:alternate",
                    "--max-running-requests", "1"]  # fmt: skip
    with (
        ServiceProcess("dataloader", dataloader_args, workdir, env=env) as dataloader,
        ServiceProcess("rollout", rollout_args, workdir, env=env) as rollout,
    ):
        connected = Services.connect(dataloader=dataloader.address, rollouts=[rollout.address])
        yield connected
        connected.close()


CONFIG = {
    "loss_type": "policy_loss",
    "rollout_batch_size": 2,
    "n_samples_per_prompt": 2,
    "global_batch_size": 4,
    "over_sampling_batch_size": 4,
    "dynamic_sampling_filter_path": "check_reward_nonzero_std",
    "partial_rollout": True,
    "mask_offpolicy_in_partial_rollout": True,
    "rollout_max_response_len": 96,
    "rollout_temperature": 1.0,
    "rm_type": "custom",
    "debug_rollout_only": True,
}


def test_aborted_groups_are_carried_over_and_continued_first(services, tmp_path):
    config = from_dict(CoordinatorConfig, CONFIG)
    state = RunState()
    first = collect_rollout(config, services, state, 0)
    assert sorted({s.group_index for s in first.samples}) == [0, 2] and len(first.samples) == 4
    assert all(s.finish_reason != ABORT for s in first.samples)
    carried = [[decode_sample(text) for text in group] for group in state.partial_groups]
    carried_groups = [g[0].group_index for g in carried]
    assert 5 in carried_groups and set(carried_groups) <= {3, 4, 5}  # group 3 may have finished first
    assert all(any(s.finish_reason == ABORT for s in g) for g in carried)
    assert first.metrics["rollout/partial/carried_groups"] == len(carried)

    # The carried state survives a run checkpoint.
    run_state.write_checkpoint(tmp_path / "ckpt", state, None)
    assert run_state.read_checkpoint(tmp_path / "ckpt")[0].partial_groups == state.partial_groups

    next_group_index = state.next_group_index
    second = collect_rollout(config, services, state, 1)
    aborted = {(s.group_index, s.index): s for g in carried for s in g if s.finish_reason == ABORT}
    assert second.metrics["rollout/partial/continued_samples"] == len(aborted)
    batch_groups = {s.group_index for s in second.samples}
    assert len(batch_groups) == 2 and len(second.samples) == 4
    # A carried group whose samples were all aborted is continued at positions 0/1 of the
    # continuation request: rewards 0 and 1, so at least one carried group makes the batch.
    assert batch_groups & set(carried_groups)
    assert all(g in carried_groups or g >= next_group_index for g in batch_groups)
    for sample in second.samples:
        assert sample.finish_reason != ABORT
        assert len(sample.rollout_log_probs) == len(sample.response_token_ids) == len(sample.loss_mask)
        old = aborted.get((sample.group_index, sample.index))
        if old is None:  # finished in rollout 0, kept as it was
            assert list(sample.loss_mask) == [1] * len(sample.response_token_ids)
            continue
        num_old = len(old.response_token_ids)
        assert list(sample.response_token_ids[:num_old]) == list(old.response_token_ids)
        assert list(sample.rollout_log_probs[:num_old]) == list(old.rollout_log_probs)
        assert list(sample.loss_mask) == [0] * num_old + [1] * (len(sample.response_token_ids) - num_old)
        assert len(sample.response_token_ids) > num_old
    assert any(len(old.response_token_ids) > 0 for old in aborted.values())  # one was cut mid-way
