"""--partial-rollout over TWO real rollout services (coordinator code in process).

remote.py splits a request's prompts over the services, and each service numbers the samples
of its share from 0. The continuation of the aborted samples is one such request, so the
coordinator must map every continued sample back to the aborted sample it continues across
both services: its weight version (that of its oldest tokens) and its off-policy loss mask
come from that sample. Each service decodes one sample at a time (--max-running-requests 1),
so a refill that has enough groups always leaves aborted samples on both services.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack

import pytest
from support.processes import ServiceProcess, start_together

from rollway.common.config import from_dict
from rollway.common.v1 import common_pb2
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.remote import Services
from rollway.coordinator.rollout_collect import collect_rollout, decode_sample, encode_sample
from rollway.coordinator.run_state import RunState
from rollway.rollout.v1 import rollout_pb2

pytestmark = pytest.mark.slow

ABORT = common_pb2.FINISH_REASON_ABORT
REWARD_MODULE = """
def alternate(sample):
    # Group 1: both samples 0 (dropped by the zero-std filter); others: 0 and 1 by sample position.
    return 0.0 if sample.group_index == 1 else float(sample.index % 2)
"""
CONFIG = {
    "loss_type": "policy_loss",
    "rollout_batch_size": 2,
    "n_samples_per_prompt": 2,
    "global_batch_size": 2,
    "over_sampling_batch_size": 6,
    "dynamic_sampling_filter_path": "check_reward_nonzero_std",
    "partial_rollout": True,
    "mask_offpolicy_in_partial_rollout": True,
    "rollout_max_response_len": 64,
    "rollout_temperature": 1.0,
    "rm_type": "custom",
    "debug_rollout_only": True,
}


@pytest.fixture(scope="module")
def services(tiny_model_dir, demo_data_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("partial-two")
    (workdir / "alternate_reward.py").write_text(REWARD_MODULE)
    env = {"PYTHONPATH": str(workdir) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    dataloader_args = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(demo_data_dir / "rl.parquet"),
                       "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--num-epoch", "0"]  # fmt: skip
    rollout_args = ["--hf-checkpoint", str(tiny_model_dir), "--custom-rm-path", "alternate_reward:alternate",
                    "--max-running-requests", "1"]  # fmt: skip
    with ExitStack() as stack:
        started = start_together(stack, {
            "dataloader": ServiceProcess("dataloader", dataloader_args, workdir, env=env),
            "first": ServiceProcess("rollout", rollout_args, workdir, env=env),
            "second": ServiceProcess("rollout", rollout_args, workdir, env=env),
        })  # fmt: skip
        rollouts = [started["first"].address, started["second"].address]
        connected = Services.connect(dataloader=started["dataloader"].address, rollouts=rollouts)
        yield connected
        connected.close()


@pytest.fixture(scope="module")
def one_service(services):
    """The first of the two rollout services on its own."""
    connected = Services.connect(rollouts=services.addresses["rollout"][:1])
    yield connected
    connected.close()


def test_two_services_generate_the_samples_one_would(services, one_service):
    # Each sample is numbered and seeded by its place in the whole request, whichever service
    # generates it: the same request gives the same samples on one service as on two.
    # One prompt three times: samples that shared a seed would be the same response.
    prompts = [rollout_pb2.Prompt(token_ids=[1, 40, 41], group_index=k) for k in range(3)]
    sampling = common_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=6, seed=7)

    def generate(on: Services):
        samples = on.generate(prompts, 2, sampling, "custom", "same-seeds")
        return [(s.group_index, s.index, list(s.response_token_ids)) for s in samples]

    two = generate(services)
    assert [(g, i) for g, i, _ in two] == [(k // 2, k) for k in range(6)]
    assert two == generate(one_service)
    assert len({tuple(tokens) for _, _, tokens in two}) == 6  # no two samples shared a seed


def test_continued_samples_keep_their_own_weight_version_and_mask_across_two_services(services):
    config = from_dict(CoordinatorConfig, CONFIG)
    state = RunState()
    first = collect_rollout(config, services, state, 0)
    assert len(first.samples) == 4 and all(s.finish_reason != ABORT for s in first.samples)
    # Samples of one request never share an index, whichever service generated them.
    assert len({(s.group_index, s.index) for s in first.samples}) == 4

    # As after several carries: every carried sample has its own weight version (100, 101, ...).
    carried = [[decode_sample(text) for text in group] for group in state.partial_groups]
    for k, sample in enumerate(s for group in carried for s in group):
        sample.weight_version = 100 + k
    state.partial_groups = [[encode_sample(s) for s in group] for group in carried]
    aborted = {(s.group_index, s.index): s for g in carried for s in g if s.finish_reason == ABORT}
    finished = {(s.group_index, s.index): s for g in carried for s in g if s.finish_reason != ABORT}
    assert len(aborted) >= 3  # the continuation request spans both services
    assert any(len(s.response_token_ids) > 0 for s in aborted.values())  # one was cut mid-way

    # Rollout 1 without the filter, so every carried group is in the batch whatever its rewards.
    unfiltered = dataclasses.replace(config, dynamic_sampling_filter_path="", rollout_batch_size=len(carried))
    second = collect_rollout(unfiltered, services, state, 1)
    assert second.metrics["rollout/partial/continued_samples"] == len(aborted)
    by_key = {(s.group_index, s.index): s for s in second.samples}
    assert set(aborted) | set(finished) <= set(by_key)
    for key, old in finished.items():  # finished before the abort: kept as they were
        assert by_key[key].weight_version == old.weight_version
        assert list(by_key[key].response_token_ids) == list(old.response_token_ids)
    for key, old in aborted.items():
        sample = by_key[key]
        num_old = len(old.response_token_ids)
        assert sample.finish_reason != ABORT
        assert sample.weight_version == old.weight_version  # its oldest tokens' version
        assert list(sample.response_token_ids[:num_old]) == list(old.response_token_ids)
        assert list(sample.rollout_log_probs[:num_old]) == list(old.rollout_log_probs)
        assert list(sample.loss_mask) == [0] * num_old + [1] * (len(sample.response_token_ids) - num_old)
