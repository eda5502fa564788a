"""Rewards on a real rollout service: a custom reward module from PYTHONPATH, built-in rewards by
name, a slow reward (timeout) and a failing one, a group reward, and start-up checks."""

from __future__ import annotations

import dataclasses
import os
import time

import grpc
import pytest
from support.processes import ServiceProcess

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.rollout.config import RolloutConfig
from rollway.rollout.rewards import RewardSample
from rollway.rollout.rewards.text_match import exact_match, f1
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

REWARD_MODULE = '''
import time


def score(sample):
    """Reward = number of response tokens; metadata.mode makes it slow or fail."""
    mode = sample.metadata.get("mode")
    if mode == "slow":
        time.sleep(20)
    if mode == "fail":
        raise ValueError("cannot score " + sample.label)
    return float(len(sample.response_token_ids))


def rank_in_group(samples):
    """Group reward: rank of each sample by response length within its group (0 = shortest)."""
    order = sorted(range(len(samples)), key=lambda i: (len(samples[i].response_token_ids), samples[i].index))
    ranks = [0.0] * len(samples)
    for rank, i in enumerate(order):
        ranks[i] = float(rank)
    return ranks


def wrong(a, b, c):
    return 0.0
'''


@pytest.fixture(scope="module")
def reward_path(tmp_path_factory):
    directory = tmp_path_factory.mktemp("rewards")
    (directory / "rollway_test_rewards.py").write_text(REWARD_MODULE)
    return directory


def _service(model_dir, workdir, reward_path, *args, **kwargs):
    env = {"PYTHONPATH": os.pathsep.join([str(reward_path), os.environ.get("PYTHONPATH", "")])}
    base = ["--hf-checkpoint", str(model_dir), "--rollout-max-response-len", "24"]
    return ServiceProcess("rollout", [*base, *args], workdir, env=env, **kwargs)


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, tmp_path_factory, reward_path):
    args = ["--custom-rm-path", "rollway_test_rewards:score", "--reward", "custom", "--reward-timeout", "1.5"]
    with _service(tiny_model_dir, tmp_path_factory.mktemp("rollout"), reward_path, *args) as svc:
        yield rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))


def _prompt(label="82", **metadata) -> rollout_pb2.Prompt:
    prompt = rollout_pb2.Prompt(token_ids=[1, 50, 60, 70], label=label)
    prompt.metadata.update(metadata)
    return prompt


def _generate(stub, prompts, n=2, reward=""):
    request = rollout_pb2.GenerateRequest(
        prompts=prompts,
        n_samples_per_prompt=n,
        reward=reward,
        sampling_params=common_pb2.SamplingParams(temperature=1.0, seed=3),
    )
    return sorted((r.sample for r in stub.Generate(request, timeout=60)), key=lambda s: s.index)


def test_custom_reward_scores_every_sample(rollout):
    samples = _generate(rollout, [_prompt(), _prompt()], n=3)
    assert len(samples) == 6
    for sample in samples:
        assert (
            sample.reward == sample.raw_reward == len(sample.response_token_ids) and not sample.reward_error
        )


def test_slow_and_failing_rewards_mark_their_samples_only(rollout):
    before = rollout.GetInfo(rollout_pb2.GetInfoRequest())
    start = time.monotonic()
    samples = _generate(rollout, [_prompt(mode="slow"), _prompt(label="7", mode="fail"), _prompt()], n=2)
    assert time.monotonic() - start < 10  # the 20 s reward was cut at --reward-timeout 1.5 s
    slow, failed, fine = samples[0:2], samples[2:4], samples[4:6]
    for sample in slow:
        assert sample.reward == 0 and "timed out after 1.5s" in sample.reward_error
    for sample in failed:
        assert sample.reward == 0 and "ValueError: cannot score 7" in sample.reward_error
    for sample in fine:
        assert sample.reward == len(sample.response_token_ids) and not sample.reward_error
    after = rollout.GetInfo(rollout_pb2.GetInfoRequest())
    assert after.num_reward_timeouts - before.num_reward_timeouts == 2
    assert after.num_reward_errors - before.num_reward_errors == 2


@pytest.mark.parametrize("name, fn", [("exact_match", exact_match), ("f1", f1)])
def test_builtin_rewards_by_name_agree_with_the_functions(rollout, name, fn):
    for sample in _generate(rollout, [_prompt(label="8"), _prompt(label="the")], n=4, reward=name):
        expected = fn(RewardSample(prompt="", response=sample.response_text, label=sample.label))
        assert sample.reward == pytest.approx(expected) and not sample.reward_error


def test_no_reward_and_unknown_reward(rollout):
    assert all(s.reward == 0 and not s.reward_error for s in _generate(rollout, [_prompt()], reward="none"))
    with pytest.raises(grpc.RpcError) as info:
        _generate(rollout, [_prompt()], reward="maths")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        info.value.details()
        == "reward: unknown reward function 'maths'; registered: custom, exact_match, f1, math, none"
    )


def test_group_reward_scores_each_group_at_once(tiny_model_dir, tmp_path, reward_path):
    args = ["--custom-rm-path", "rollway_test_rewards:rank_in_group", "--group-rm", "--reward", "custom"]
    with _service(tiny_model_dir, tmp_path, reward_path, *args) as svc:
        stub = rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))
        request = rollout_pb2.GenerateRequest(
            prompts=[_prompt(), _prompt()],
            n_samples_per_prompt=4,
            sampling_params=common_pb2.SamplingParams(
                temperature=1.0, seed=8, stop_token_ids=list(range(300, 340))
            ),
        )
        arrivals = [r.sample for r in stub.Generate(request, timeout=60)]
    for group in (0, 1):
        members = [s for s in arrivals if s.group_index == group]
        assert sorted(s.reward for s in members) == [0.0, 1.0, 2.0, 3.0]
        by_rank = sorted(members, key=lambda s: s.reward)
        assert [len(s.response_token_ids) for s in by_rank] == sorted(
            len(s.response_token_ids) for s in members
        )
        positions = [i for i, s in enumerate(arrivals) if s.group_index == group]
        assert positions == list(range(positions[0], positions[0] + 4))  # a group streams back together


@pytest.mark.parametrize(
    "path, message",
    [
        ("rollway_no_such_module:score", "custom_rm_path: cannot import 'rollway_no_such_module'"),
        (
            "rollway_test_rewards:missing",
            "custom_rm_path: module 'rollway_test_rewards' has no attribute 'missing'",
        ),
        ("rollway_test_rewards:wrong", "must take (sample) or (args, sample); it takes (a, b, c)"),
    ],
)
def test_bad_custom_reward_stops_the_service_at_start_up(
    tiny_model_dir, tmp_path, reward_path, path, message
):
    service = _service(tiny_model_dir, tmp_path, reward_path, "--custom-rm-path", path, "--reward", "custom")
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        service.start()
    assert message in str(info.value)
    assert time.monotonic() - start < 30


def test_an_unlabelled_prompt_is_never_scored_against_an_empty_label(rollout):
    """exact_match once scored "" against a whitespace-only response as 1: an unlabelled prompt's
    samples now get reward 0 and a reward_error saying why; a reward that needs no label takes it."""
    for name in ("exact_match", "math", "f1"):
        samples = _generate(rollout, [_prompt(label="8"), _prompt(label=" ")], reward=name)
        labelled, unlabelled = samples[:2], samples[2:]
        assert all("no label" not in s.reward_error for s in labelled)
        for sample in unlabelled:
            assert sample.reward == sample.raw_reward == 0.0
            assert "the prompt has no label: not scored (reward 0)" in sample.reward_error, name
    for sample in _generate(rollout, [_prompt(label="")], n=2):  # --reward custom: no label needed
        assert sample.reward == len(sample.response_token_ids) and not sample.reward_error


def test_zero_samples_per_prompt_means_the_service_default(rollout):
    """proto3 cannot tell 0 from absent: both mean --n-samples-per-prompt (documented in the proto)."""
    default = next(f.default for f in dataclasses.fields(RolloutConfig) if f.name == "n_samples_per_prompt")
    assert len(_generate(rollout, [_prompt(), _prompt()], n=0)) == 2 * default  # not 0 samples
    assert len(_generate(rollout, [_prompt(), _prompt()], n=3)) == 6
    with pytest.raises(grpc.RpcError) as refused:
        _generate(rollout, [_prompt()], n=-1)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
