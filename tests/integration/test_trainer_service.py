"""The trainer over gRPC: a real `python -m rollway.trainer` with 2 FSDP2 ranks on gloo.

The tests run in file order against one process: before Init, Init, read-only RPCs on the
loaded weights, bad input, training and retries, then checkpoints (including a corrupt one).
Every refused request must leave the ranks in step: a good request afterwards still works.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import ServiceProcess
from support.trainer_steps import struct
from transformers import AutoModelForCausalLM

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.common.weights_checksum import weights_checksum
from rollway.trainer.v1 import trainer_pb2 as pb
from rollway.trainer.v1 import trainer_pb2_grpc

pytestmark = pytest.mark.slow
MAX_TOKENS = 64


def sample(prompt: list[int], response: list[int], loss_mask: list[int] | None = None) -> common_pb2.Sample:
    mask = [1] * len(response) if loss_mask is None else loss_mask
    return common_pb2.Sample(prompt_token_ids=prompt, response_token_ids=response, loss_mask=mask)


BATCH = [
    sample([1, 40, 41], [50, 51, 52, 53, 2]),
    sample([], [1, 60, 61, 62, 63, 64, 65, 2], [0, 0, 1, 1, 1, 1, 1, 1]),
    sample([1, 70], [71, 72, 2]),
]


def train_stream(step_id: int, samples, num_samples: int | None = None, overrides: dict | None = None):
    header = pb.TrainStepHeader(
        step_id=step_id,
        num_samples=len(samples) if num_samples is None else num_samples,
        overrides=struct(overrides or {}),
    )
    yield pb.TrainStepRequest(header=header)
    for start in range(0, len(samples), 2):
        yield pb.TrainStepRequest(samples=pb.SampleChunk(samples=samples[start : start + 2]))


def log_prob_stream(
    samples, temperature: float = 1.0, with_entropy: bool = False, use_reference: bool = False
):
    yield pb.ComputeLogProbsRequest(
        header=pb.ComputeLogProbsHeader(
            temperature=temperature, with_entropy=with_entropy, use_reference=use_reference
        )
    )
    yield pb.ComputeLogProbsRequest(samples=pb.SampleChunk(samples=samples))


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trainer")
    args = ["--hf-checkpoint", str(tiny_model_dir), "--world-size", "2", "--dtype", "float32"]
    args += ["--max-tokens-per-gpu", str(MAX_TOKENS), "--use-dynamic-batch-size", "--loss-type", "sft_loss"]
    with ServiceProcess("trainer", args, workdir) as svc:
        svc.workdir = workdir
        yield svc


@pytest.fixture(scope="module")
def stub(trainer):
    with open_channel(trainer.address) as channel:
        yield trainer_pb2_grpc.TrainerServiceStub(channel)


@pytest.fixture(scope="module")
def local_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def refused(call, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    for fragment in fragments:
        assert fragment in err.value.details()
    return err.value.details()


def test_train_step_and_save_before_init_are_failed_precondition(stub, tmp_path):
    refused(
        lambda: stub.TrainStep(train_stream(0, BATCH)), grpc.StatusCode.FAILED_PRECONDITION, "before Init"
    )
    refused(
        lambda: stub.SaveCheckpoint(pb.SaveCheckpointRequest(path=str(tmp_path))),
        grpc.StatusCode.FAILED_PRECONDITION,
        "before Init",
    )


def test_init_refuses_start_up_and_unknown_settings_and_repeats_as_a_no_op(stub, local_model):
    settings = {"lr": 2e-3, "clip_grad": 0.0, "lr_warmup_iters": 2}
    first = stub.Init(pb.InitRequest(config=struct(settings), run_id="run-1"))
    assert (first.world_size, first.global_step, first.already_initialized) == (2, 0, False)
    assert first.num_parameters == sum(p.numel() for p in local_model.parameters())
    assert (first.run_id, first.vocab_size) == ("run-1", local_model.config.vocab_size)
    assert first.settings["lr"] == 2e-3
    refused(
        lambda: stub.Init(pb.InitRequest(config=struct({**settings, "dtype": "bfloat16"}), run_id="run-1")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "config.dtype: cannot be changed within run 'run-1'",
    )
    refused(
        lambda: stub.Init(pb.InitRequest(config=struct({"learning_rate": 1.0}), run_id="run-1")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "config.learning_rate: unknown setting",
    )
    assert stub.Init(pb.InitRequest(config=struct(settings), run_id="run-1")).already_initialized
    refused(
        lambda: stub.Init(pb.InitRequest(config=struct(settings), run_id="run-2")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "serves run 'run-1'",
    )
    assert stub.EndRun(pb.EndRunRequest(run_id="run-1")).was_holding
    assert not stub.EndRun(pb.EndRunRequest(run_id="run-1")).was_holding


def test_weight_checksum_matches_the_shared_checksum_of_the_checkpoint(stub, local_model):
    for dtype in ("float32", "bfloat16"):
        reply = stub.WeightChecksum(pb.WeightChecksumRequest(dtype=dtype)).checksum
        expected = weights_checksum(local_model.named_parameters(), getattr(torch, dtype))
        assert (reply.algorithm, reply.digest, reply.num_tensors) == ("sha256", *expected)
    refused(
        lambda: stub.WeightChecksum(pb.WeightChecksumRequest(dtype="int3")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "dtype",
    )


def test_compute_log_probs_match_transformers_with_temperature(stub, local_model):
    samples = [BATCH[0], BATCH[2], sample([5, 6, 7, 8], [9, 10])]
    replies = list(stub.ComputeLogProbs(log_prob_stream(samples, temperature=0.7, with_entropy=True)))
    results = [r for reply in replies for r in reply.results]
    assert [r.index for r in results] == [0, 1, 2]
    for result, s in zip(results, samples, strict=True):
        ids = torch.tensor([list(s.prompt_token_ids) + list(s.response_token_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(local_model(input_ids=ids).logits[0].float() / 0.7, -1)
        start = len(s.prompt_token_ids)
        rows = logp[start - 1 : -1]
        expected = rows.gather(-1, ids[0, start:, None])[:, 0]
        assert list(result.log_probs) == pytest.approx(expected.tolist(), abs=1e-5)
        assert list(result.entropy) == pytest.approx((-(rows.exp() * rows).sum(-1)).tolist(), abs=1e-4)


def test_compute_log_probs_bad_input(stub):
    refused(
        lambda: list(stub.ComputeLogProbs(log_prob_stream([BATCH[1]]))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "samples[0].prompt_token_ids: must not be empty",
    )
    refused(
        lambda: list(stub.ComputeLogProbs(log_prob_stream([BATCH[0]], temperature=-1.0))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "header.temperature",
    )


BAD_BATCHES = [
    ("empty batch", lambda: train_stream(100, []), grpc.StatusCode.INVALID_ARGUMENT, "samples: empty batch"),
    (
        "token out of vocabulary",
        lambda: train_stream(101, [BATCH[0], sample([1], [2, 100000])]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "samples[1].response_token_ids: token id 100000 is outside the vocabulary",
    ),
    (
        "mask length",
        lambda: train_stream(102, [sample([1], [2, 3, 4], [1, 1])]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "samples[0].loss_mask: has 2 entries for 3 response tokens",
    ),
    (
        "over the token budget",
        lambda: train_stream(103, [BATCH[0], sample([1], [5] * MAX_TOKENS)]),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"samples[1]: {MAX_TOKENS + 1} tokens",
    ),
    (
        "announced count",
        lambda: train_stream(104, BATCH, num_samples=5),
        grpc.StatusCode.INVALID_ARGUMENT,
        "header.num_samples: announced 5 samples but 3 arrived",
    ),
    (
        "samples before the header",
        lambda: iter([pb.TrainStepRequest(samples=pb.SampleChunk(samples=BATCH))]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "header: the first message must be a TrainStepHeader",
    ),
    (
        "override of a non-loss setting",
        lambda: train_stream(105, BATCH, overrides={"lr": 1.0}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "header.overrides.lr",
    ),
]


@pytest.mark.parametrize(
    "make_stream, code, message", [b[1:] for b in BAD_BATCHES], ids=[b[0] for b in BAD_BATCHES]
)
def test_bad_batches_are_refused_with_the_field_named(stub, make_stream, code, message):
    refused(lambda: stub.TrainStep(make_stream()), code, message)


PHASES = ("data", "log_probs", "ref_log_probs", "forward", "backward", "optimizer")


def assert_time_breakdown(metrics: dict) -> None:
    """Every TrainStep reports where its time went: the phases do not overlap, so they add up to
    at most the step; rank 0's engine time and the dispatch to the ranks are parts of it too."""
    phases = [metrics[f"perf/{name}_time"] for name in PHASES]
    assert min(phases) >= 0
    assert metrics["perf/forward_time"] > 0 and metrics["perf/backward_time"] > 0
    assert metrics["perf/optimizer_time"] > 0 and metrics["perf/data_time"] > 0
    assert sum(phases) <= metrics["perf/step_time"]
    engine_and_dispatch = metrics["perf/actor_train_time"] + metrics["perf/dispatch_time"]
    assert engine_and_dispatch <= metrics["perf/step_time"] * 1.001
    # what the phases leave out is bookkeeping: a fraction of the step, not most of it
    assert sum(phases) >= 0.5 * metrics["perf/actor_train_time"]


def test_training_works_after_refusals_and_a_retry_returns_the_stored_result(stub, trainer):
    first = stub.TrainStep(train_stream(1, BATCH))
    assert (first.step_id, first.global_step, first.already_applied) == (1, 1, False)
    metrics = dict(first.metrics)
    assert 5.0 < metrics["train/loss"] < 7.0
    assert metrics["train/lr"] == pytest.approx(1e-3)  # step 0 of a 2-step warmup to 2e-3
    assert metrics["train/num_samples"] == 3 and metrics["train/num_tokens"] == 21
    assert metrics["train/num_loss_tokens"] == 5 + 6 + 3
    assert metrics["train/grad_norm"] > 0 and 0 < metrics["train/packing_efficiency"] <= 1
    assert metrics["perf/tokens_per_s"] > 0
    assert_time_breakdown(metrics)
    retry = stub.TrainStep(train_stream(1, BATCH))
    assert (retry.global_step, retry.already_applied, dict(retry.metrics)) == (1, True, metrics)
    losses = [stub.TrainStep(train_stream(step, BATCH)).metrics["train/loss"] for step in (2, 3, 4)]
    assert losses[-1] < losses[0] < metrics["train/loss"]
    per_token = stub.TrainStep(train_stream(5, BATCH, overrides={"calculate_per_token_loss": True}))
    assert per_token.metrics["train/loss"] == pytest.approx(per_token.metrics["train/per_token_loss"])


def test_checkpoint_save_load_and_a_corrupt_checkpoint_is_refused(stub, trainer, tmp_path):
    saved = stub.SaveCheckpoint(
        pb.SaveCheckpointRequest(
            path=str(tmp_path), hf_export=True, extra_state=struct({"next_rollout_id": 6})
        )
    )
    assert saved.global_step == 5 and Path(saved.checkpoint_dir).name == "iter_0000005"
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "5"
    manifest = json.loads((Path(saved.checkpoint_dir) / "manifest.json").read_text())
    assert "hf/model.safetensors" in manifest["files"] and "rng/rank_00001.pt" in manifest["files"]
    trained = stub.WeightChecksum(pb.WeightChecksumRequest(dtype="float32")).checksum.digest
    stub.TrainStep(train_stream(6, BATCH))  # move away from the saved weights
    loaded = stub.LoadCheckpoint(pb.LoadCheckpointRequest(path=str(tmp_path)))
    assert (loaded.checkpoint_dir, loaded.global_step) == (saved.checkpoint_dir, 5)
    assert dict(loaded.extra_state) == {"next_rollout_id": 6}
    assert stub.WeightChecksum(pb.WeightChecksumRequest(dtype="float32")).checksum.digest == trained
    assert stub.TrainStep(train_stream(5, BATCH)).already_applied  # results up to the save come back
    again = stub.TrainStep(train_stream(6, BATCH))  # step 6 came after the save: it trains again
    assert (again.already_applied, again.global_step) == (False, 6)

    shard = sorted(Path(saved.checkpoint_dir, "model").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    refused(
        lambda: stub.LoadCheckpoint(pb.LoadCheckpointRequest(path=str(tmp_path))),
        grpc.StatusCode.FAILED_PRECONDITION,
        "checkpoint refused",
        shard.name,
        "sha256 does not match",
    )
    refused(
        lambda: stub.LoadCheckpoint(pb.LoadCheckpointRequest(path=str(tmp_path / "missing"))),
        grpc.StatusCode.NOT_FOUND,
    )
    assert stub.TrainStep(train_stream(7, BATCH)).global_step == 7  # still serving, ranks in step


def test_weight_sync_rpcs_refuse_requests_without_a_group_and_keep_serving(stub, trainer):
    # The transfers themselves are tested in test_weight_sync.py; here: bad requests answer cleanly.
    for call in (
        lambda: list(stub.PushWeights(pb.PushWeightsRequest(weight_version=1))),
        lambda: stub.InitWeightGroup(pb.InitWeightGroupRequest()),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    with open_channel(trainer.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_num_steps_per_rollout_splits_the_batch_into_optimizer_steps(stub):
    before = stub.TrainStep(train_stream(8, BATCH)).global_step
    reply = stub.Init(
        pb.InitRequest(config=struct({"lr": 2e-3, "clip_grad": 0.0, "num_steps_per_rollout": 3}))
    )
    assert not reply.already_initialized and reply.global_step == before
    after = stub.TrainStep(train_stream(9, BATCH))
    assert after.global_step == before + 3
    assert after.metrics["train/num_samples"] == 3
    assert_time_breakdown(dict(after.metrics))  # summed over the 3 optimizer steps
