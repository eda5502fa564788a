"""The rollout receiver (WeightReceiver over an hf engine) against the trainer's real send code.

The sender is rollway.trainer.weight_sync on a plain (unsharded) copy of the model, in a thread of
this process; the two ends form a real two-rank gloo group on loopback.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from support.weight_faults import faulty, injected
from transformers import AutoModelForCausalLM

from rollway.common.errors import FailedPrecondition, InvalidArgument, RollwayError
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.buckets import to_manifest
from rollway.common.weight_sync.group import (
    STATUS_ALREADY_APPLIED,
    STATUS_CHECKSUM_MISMATCH,
    STATUS_OK,
    STATUS_REFUSED,
    GroupSpec,
    WeightGroup,
)
from rollway.common.weights_checksum import weights_checksum
from rollway.coordinator.weight_sync import free_port
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.hf import HFEngine
from rollway.rollout.v1 import rollout_pb2
from rollway.rollout.weight_sync.receiver import WeightReceiver
from rollway.trainer.weight_sync.base import checksum_pass, plan_layout
from rollway.trainer.weight_sync.distributed import DistributedSender, broadcast_pass

BUCKET = 256 * 1024


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    torch.set_num_threads(1)
    engine = HFEngine(RolloutConfig(hf_checkpoint=str(tiny_model_dir), dtype="float32"))
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    """The sender's model: the checkpoint with every weight moved (as after training)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.01 * (i + 1))
    return model


def _checksum(named) -> str:
    return weights_checksum(named, torch.float32)[0]


def _connect(receiver: WeightReceiver) -> DistributedSender:
    """Rank 0 in a thread, the receiver as rank 1: both must be inside the rendezvous at once."""
    spec = common_pb2.WeightGroupSpec(
        group_name=f"test-{uuid.uuid4().hex[:6]}",
        master_address="127.0.0.1",
        master_port=free_port(),
        world_size=2,
        rank_offset=1,
        backend="gloo",
        timeout_seconds=20,
    )
    sender_spec = GroupSpec.from_proto(spec)
    with ThreadPoolExecutor(1) as pool:
        group = pool.submit(WeightGroup, GroupSpec(**{**sender_spec.__dict__, "rank_offset": 0}), 0)
        ranks, already = receiver.init_group(spec)
        assert (ranks, already) == ([1], False)
        assert receiver.init_group(spec) == ([1], True)  # the same spec again: a no-op
        return DistributedSender(group.result(timeout=30))


def _push(receiver, sender, model, version, edit=None, acknowledge=True, chunk=0):
    """Plan + send `model` as `version` while the receiver takes it: (reply or error, sender result)."""
    buckets = plan_layout(model, torch.float32, BUCKET)
    checksum_pass(model, buckets, rank=0)
    manifest = to_manifest(buckets, version, "distributed", broadcast_chunk_bytes=chunk)
    if edit:
        edit(manifest)
    request = rollout_pb2.UpdateWeightsRequest(manifest=manifest, acknowledge=acknowledge)
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(broadcast_pass, model, buckets, 0, sender, acknowledge, chunk)
        try:
            outcome = receiver.update(request)
        except RollwayError as exc:
            outcome = exc
        sent = sending.result(timeout=60)
    assert not sent.error
    return outcome, sent


@pytest.mark.parametrize("chunk", [0, 64 * 1024], ids=["whole-buckets", "64KiB-pieces"])
def test_update_verifies_swaps_in_and_commits_then_retries_and_regressions_change_nothing(
    engine, trained, chunk
):
    receiver = WeightReceiver(engine)
    sender = _connect(receiver)
    engine.weight_version = 0
    old = _checksum(engine.named_parameters())
    if chunk:  # start from different weights than the first run left
        engine.scramble_weights(seed=1)
        old = _checksum(engine.named_parameters())
    reply, sent = _push(receiver, sender, trained, version=3, chunk=chunk)
    assert (reply.weight_version, reply.already_applied, sent.receiver_status) == (3, False, [STATUS_OK])
    assert engine.weight_version == 3
    assert _checksum(engine.named_parameters()) == _checksum(trained.named_parameters()) != old
    assert reply.timings.wire_seconds > 0 and reply.timings.verify_seconds > 0
    first_live = receiver.pool.live
    # The parameters now live in the staging set just received (swapped, not copied).
    live = receiver.pool._sets[first_live]
    embed = engine.weight_tensors()["model.embed_tokens.weight"]
    assert any(b.data_ptr() <= embed.data_ptr() < b.data_ptr() + b.numel() for b in live)

    reply, sent = _push(receiver, sender, trained, version=3, chunk=chunk)  # a retry: received and dropped
    assert (reply.weight_version, reply.already_applied, sent.receiver_status) == (
        3,
        True,
        [STATUS_ALREADY_APPLIED],
    )

    error, sent = _push(
        receiver, sender, trained, version=2, chunk=chunk
    )  # backwards: refused after the transfer
    assert isinstance(error, FailedPrecondition) and "only move forward" in error.message
    assert sent.receiver_status == [STATUS_REFUSED] and engine.weight_version == 3

    reply, _ = _push(
        receiver, sender, trained, version=4, chunk=chunk
    )  # the other staging set; the first is freed
    assert reply.weight_version == 4 and receiver.pool.live != first_live and len(receiver.pool._sets) == 2
    receiver.close()


def test_corrupt_bucket_is_refused_and_the_old_weights_keep_serving(engine, trained):
    receiver = WeightReceiver(engine)
    sender = _connect(receiver)
    version, before = engine.weight_version, _checksum(engine.named_parameters())
    with torch.no_grad():
        moved = {name: p + 1.0 for name, p in trained.named_parameters()}
        for name, p in trained.named_parameters():
            p.copy_(moved[name])
    with injected(faulty(corrupt=True)):
        error, sent = _push(receiver, sender, trained, version=version + 1, chunk=64 * 1024)
    assert isinstance(error, RollwayError) and error.code == grpc.StatusCode.DATA_LOSS
    assert "bucket(s) [0]" in error.message
    assert sent.receiver_status == [STATUS_CHECKSUM_MISMATCH]
    assert engine.weight_version == version and _checksum(engine.named_parameters()) == before
    reply, _ = _push(receiver, sender, trained, version=version + 1)  # the same group still works
    assert reply.weight_version == version + 1
    assert _checksum(engine.named_parameters()) == _checksum(trained.named_parameters())
    receiver.close()


def test_manifest_that_does_not_fit_the_model_is_drained_and_refused(engine, trained):
    receiver = WeightReceiver(engine)
    sender = _connect(receiver)
    version, before = engine.weight_version, _checksum(engine.named_parameters())

    def rename(manifest):
        manifest.buckets[0].tensors[0].name = "model.not_a_layer.weight"

    error, sent = _push(receiver, sender, trained, version=version + 1, edit=rename)
    assert isinstance(error, InvalidArgument) and "not_a_layer" in error.message
    assert sent.receiver_status == [STATUS_REFUSED]
    assert engine.weight_version == version and _checksum(engine.named_parameters()) == before
    with pytest.raises(InvalidArgument, match="manifest.buckets"):
        receiver.update(rollout_pb2.UpdateWeightsRequest(manifest=common_pb2.WeightManifest(
            weight_version=9, transport="distributed", checksum_algorithm="blocksum64")))  # fmt: skip
    receiver.close()
    buckets = plan_layout(trained, torch.float32, BUCKET)
    checksum_pass(trained, buckets, rank=0)
    manifest = to_manifest(buckets, version + 1, "distributed")
    with pytest.raises(FailedPrecondition, match="InitWeightGroup"):  # the group is gone: nothing to receive
        receiver.update(rollout_pb2.UpdateWeightsRequest(manifest=manifest))
    sender.group.destroy()
