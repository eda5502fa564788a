"""An environment served by its own process (the Environment gRPC service) behind a real rollout
service: episodes over gRPC, and a remote environment killed mid-episode fails its samples
(returned with FINISH_REASON_FAILED, neither hung nor lost)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc
import pytest
from support.processes import ServiceProcess
from support.waiting import wait_until

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

TESTS_DIR = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
    args = [
        "--environment",
        "custom",
        "--custom-generate-function-path",
        "support.remote_environments:ScriptedEnvironment",
    ]
    env = {"PYTHONPATH": TESTS_DIR + ":" + __import__("os").environ.get("PYTHONPATH", "")}
    with ServiceProcess(
        "environment",
        args,
        tmp_path_factory.mktemp("environment"),
        module="rollway.environment",
        env=env,
    ) as svc:
        yield svc


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, environment, tmp_path_factory):
    args = [
        "--hf-checkpoint", str(tiny_model_dir),
        "--environment", "remote",
        "--environment-url", environment.address,
        "--environment-step-timeout", "60",
    ]  # fmt: skip
    with ServiceProcess("rollout", args, tmp_path_factory.mktemp("rollout")) as svc:
        yield rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))


def _request(metadata: dict, n: int) -> rollout_pb2.GenerateRequest:
    prompt = rollout_pb2.Prompt(token_ids=[1, 50, 60, 70])
    prompt.metadata.update(metadata)
    return rollout_pb2.GenerateRequest(
        prompts=[prompt],
        n_samples_per_prompt=n,
        # Most tokens end the random model's turn, so its turns end with "stop".
        sampling_params=common_pb2.SamplingParams(
            temperature=1.0, max_new_tokens=8, seed=3, stop_token_ids=list(range(3, 300))
        ),
    )


def test_episodes_run_against_an_environment_in_another_process(rollout):
    samples = [r.sample for r in rollout.Generate(_request({"turns": 2}, n=3), timeout=60)]
    assert sorted(s.index for s in samples) == [0, 1, 2]
    for s in samples:
        assert s.finish_reason == common_pb2.FINISH_REASON_STOP
        assert [t.role for t in s.turns] == ["model", "environment", "model"]
        assert s.reward == pytest.approx(1.0)
        assert dict(s.metrics) == {"steps": 2.0}  # the last step's value, across the process boundary
        assert len(s.loss_mask) == len(s.response_token_ids) == len(s.rollout_log_probs)
        env_tokens = s.turns[1].num_tokens
        start = s.turns[0].num_tokens
        assert list(s.loss_mask[start : start + env_tokens]) == [0] * env_tokens
        assert "obs 1." in s.response_text


def test_a_request_chooses_its_environment(rollout):
    request = _request({"turns": 2}, n=1)
    request.environment = "none"  # single turn: no episode
    [reply] = list(rollout.Generate(request, timeout=60))
    assert not reply.sample.turns and set(reply.sample.loss_mask) == {1}
    request.environment = "chess"
    with pytest.raises(grpc.RpcError) as err:
        list(rollout.Generate(request, timeout=60))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "environment" in err.value.details()


def test_a_remote_environment_killed_mid_episode_fails_its_samples(rollout, environment, tmp_path):
    marker = tmp_path / "stuck"
    samples, errors = [], []

    def generate():
        try:
            samples.extend(
                r.sample for r in rollout.Generate(_request({"stuck_marker": str(marker)}, n=4), timeout=90)
            )
        except Exception as exc:  # reported below
            errors.append(exc)

    caller = threading.Thread(target=generate)
    caller.start()
    wait_until(marker.exists, 60, "the environment to be inside a step")
    killed_at = time.monotonic()
    environment.signal(signal.SIGKILL)
    caller.join(60)
    assert not caller.is_alive() and not errors
    assert time.monotonic() - killed_at < 30  # failed at once, not after --environment-step-timeout
    assert sorted(s.index for s in samples) == [0, 1, 2, 3]
    for s in samples:
        assert s.finish_reason == common_pb2.FINISH_REASON_FAILED
        assert "remote environment" in s.reward_error and "UNAVAILABLE" in s.reward_error
        assert s.turns[0].role == "model" and len(s.response_token_ids) == s.turns[0].num_tokens
