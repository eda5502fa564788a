"""RL over gRPC against a real `python -m rollway.trainer` (1 rank, fp32, policy_loss by default).

The tests run in file order against one process: reference == policy at step 0, a GRPO step
that raises the probability of high-advantage responses and lowers the others' (while the
reference stays put), metrics with Miles' names, and bad RL input that is refused by name
while the trainer keeps serving.
"""

from __future__ import annotations

import grpc
import pytest
from support.processes import ServiceProcess
from support.trainer_steps import struct

from rollway.common.advantages import group_normalised
from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.trainer.v1 import trainer_pb2 as pb
from rollway.trainer.v1 import trainer_pb2_grpc

pytestmark = pytest.mark.slow

PROMPTS = [[1, 40, 41, 42], [1, 70, 71]]
RESPONSES = [[[50, 51, 52, 2], [60, 61, 2]], [[80, 81, 82, 83, 2], [90, 91, 2]]]  # two per prompt
REWARDS = [1.0, 0.0, 0.0, 1.0]  # the 1st and 4th responses are the good ones


def rl_samples(rollout_log_probs: list[list[float]] | None = None) -> list[common_pb2.Sample]:
    advantages = group_normalised(REWARDS, 2)
    samples = []
    for k, (prompt, response) in enumerate(
        (p, r) for p, rs in zip(PROMPTS, RESPONSES, strict=True) for r in rs
    ):
        sample = common_pb2.Sample(
            group_index=k // 2,
            index=k,
            prompt_token_ids=prompt,
            response_token_ids=response,
            loss_mask=[1] * len(response),
            reward=REWARDS[k],
            raw_reward=REWARDS[k],
            advantages=[float(advantages[k])] * len(response),
            source="math" if k < 2 else "code",
        )
        if rollout_log_probs is not None:
            sample.rollout_log_probs.extend(rollout_log_probs[k])
        samples.append(sample)
    return samples


def train_stream(step_id: int, samples, overrides: dict | None = None):
    header = pb.TrainStepHeader(step_id=step_id, num_samples=len(samples), overrides=struct(overrides or {}))
    yield pb.TrainStepRequest(header=header)
    yield pb.TrainStepRequest(samples=pb.SampleChunk(samples=samples))


def log_probs(stub, samples, use_reference: bool = False) -> list[list[float]]:
    def requests():
        yield pb.ComputeLogProbsRequest(
            header=pb.ComputeLogProbsHeader(temperature=1.0, use_reference=use_reference)
        )
        yield pb.ComputeLogProbsRequest(samples=pb.SampleChunk(samples=samples))

    return [list(r.log_probs) for reply in stub.ComputeLogProbs(requests()) for r in reply.results]


@pytest.fixture(scope="module")
def stub(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trainer-rl")
    args = ["--hf-checkpoint", str(tiny_model_dir), "--dtype", "float32", "--clip-grad", "0"]
    with ServiceProcess("trainer", args, workdir) as service, open_channel(service.address) as channel:
        yield trainer_pb2_grpc.TrainerServiceStub(channel)


def refused(call, *fragments: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    for fragment in fragments:
        assert fragment in err.value.details()


def test_reference_equals_policy_exactly_before_training(stub):
    stub.Init(pb.InitRequest(config=struct({"lr": 2e-3, "use_kl_loss": True, "kl_loss_coef": 0.01})))
    samples = rl_samples()
    assert log_probs(stub, samples, use_reference=True) == log_probs(stub, samples)


def test_a_grpo_step_raises_the_probability_of_high_advantage_responses(stub):
    before = log_probs(stub, rl_samples())
    reply = stub.TrainStep(train_stream(0, rl_samples(rollout_log_probs=before)))
    metrics = dict(reply.metrics)
    # Step 0: ratio 1 and no KL yet; the rollout log-probs are the trainer's own.
    assert metrics["train/kl_loss"] == 0.0 and metrics["train/ppo_kl"] == 0.0
    assert metrics["train/pg_clipfrac"] == 0.0
    assert metrics["train/pg_loss"] == pytest.approx(0.0, abs=1e-6)  # advantages sum to 0 per group
    assert metrics["train/train_rollout_logprob_abs_diff"] < 1e-5
    assert metrics["train/train_rollout_kl"] < 1e-9
    assert 0 < metrics["train/entropy_loss"] < 6.0 and metrics["train/grad_norm"] > 0
    assert metrics["train/lr"] == pytest.approx(2e-3)
    # Per source: mean over the source's samples of -A (math: +1, -1; code: -1, +1).
    assert metrics["train/loss/math"] == pytest.approx(0.0, abs=1e-5)
    after = log_probs(stub, rl_samples())
    change = [sum(a) - sum(b) for a, b in zip(after, before, strict=True)]
    assert change[0] > 0.05 and change[3] > 0.05  # rewarded responses became more likely
    assert change[1] < -0.05 and change[2] < -0.05
    assert log_probs(stub, rl_samples(), use_reference=True) == before  # the reference stays


def test_the_kl_loss_grows_once_the_policy_moved(stub):
    reply = stub.TrainStep(train_stream(1, rl_samples()))
    assert reply.metrics["train/kl_loss"] != 0.0 and reply.global_step == 2
    assert "train/train_rollout_kl" not in reply.metrics  # no rollout log-probs sent


@pytest.mark.parametrize(
    "make, overrides, fragments",
    [
        (
            lambda: [common_pb2.Sample(prompt_token_ids=[1], response_token_ids=[5, 6], loss_mask=[1, 1])],
            {},
            ("samples[0].advantages: has 0 entries for 2 response tokens",),
        ),
        (lambda: rl_samples(), {"use_tis": True}, ("samples[0].rollout_log_probs: required with use_tis",)),
        (lambda: rl_samples(), {"use_rollout_logprobs": True}, ("required with use_rollout_logprobs",)),
        (
            lambda: rl_samples()[:1] + rl_samples([[-1.0] * 4] * 4)[1:2],
            {},
            ("samples[0].rollout_log_probs: missing while other samples carry them",),
        ),
        (lambda: rl_samples([[-1.0] * 2] * 4), {}, ("samples[0].rollout_log_probs: has 2 entries for 4",)),
        (
            lambda: [common_pb2.Sample(response_token_ids=[5, 6], loss_mask=[1, 1], advantages=[1.0, 1.0])],
            {},
            ("samples[0].prompt_token_ids: must not be empty",),
        ),
        (lambda: rl_samples(), {"kl_coef": 0.1}, ("header.overrides.kl_coef: KL is a reward penalty",)),
        (
            lambda: rl_samples(),
            {"advantage_estimator": "reinforce_plus_plus"},
            ("header.overrides.advantage_estimator: cannot be changed here",),
        ),
        (lambda: rl_samples(), {"eps_clip_c": 0.5}, ("header.overrides.eps_clip_c: must be greater than 1",)),
    ],
)
def test_bad_rl_input_is_refused_by_name(stub, make, overrides, fragments):
    refused(lambda: stub.TrainStep(train_stream(100, make(), overrides)), *fragments)


def test_training_works_after_refusals_with_reinforce_plus_plus_and_tis(stub):
    # The estimator is the run's (Init), not a step's.
    run = {"lr": 2e-3, "advantage_estimator": "reinforce_plus_plus", "normalize_advantages": True}
    stub.Init(pb.InitRequest(config=struct(run)))
    rollout = log_probs(stub, rl_samples())
    overrides = {"use_kl_loss": False, "kl_coef": 0.05, "use_tis": True, "gamma": 0.9}
    reply = stub.TrainStep(train_stream(2, rl_samples(rollout_log_probs=rollout), overrides))
    metrics = dict(reply.metrics)
    assert reply.global_step == 3 and metrics["train/tis"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["train/tis_clipfrac"] == 0.0 and "train/kl_loss" not in metrics
