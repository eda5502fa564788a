"""Weight sync through the sglang engine against SGLang's HTTP protocol (the recording peer).

SGLang's servers join the weight group themselves, so here only the HTTP side is checked: what
each server is asked to do, in which order, and that the version is committed (or not)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import torch
from safetensors.torch import save_file
from support.ports import free_port
from support.sglang_engine import start_sglang_engine as _engine
from support.waiting import wait_until

from rollway.common.errors import FailedPrecondition, InvalidArgument, RollwayError
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync import group as group_module
from rollway.common.weight_sync.bucket_checksum import BucketChecksum, as_bytes
from rollway.common.weight_sync.buckets import TensorEntry, bucket_file_name, plan_buckets, to_manifest
from rollway.common.weight_sync.group import HOST_KEY, GroupSpec, host_group_store
from rollway.rollout.v1 import rollout_pb2
from rollway.rollout.weight_sync.receiver import weight_receiver


def _spec(world_size=3, rank_offset=1) -> common_pb2.WeightGroupSpec:
    return common_pb2.WeightGroupSpec(group_name="g1", master_address="127.0.0.1", master_port=STORE_PORT,
                                      world_size=world_size, rank_offset=rank_offset, backend="nccl",
                                      timeout_seconds=60)  # fmt: skip


STORE_PORT = free_port()


@pytest.fixture(scope="module", autouse=True)
def group_store():
    """The trainer's side of the group: its store, naming g1 (the servers are recordings and join
    nothing; the receiver checks the store before it asks them to)."""
    return host_group_store(GroupSpec.from_proto(_spec()))


TENSORS = {"a.weight": torch.randn(64, 8), "b.bias": torch.randn(8), "c.weight": torch.randn(128, 8)}


def _manifest(version: int, transport="distributed", disk_path="", chunk=0) -> common_pb2.WeightManifest:
    specs = [TensorEntry(name, "float32", tuple(t.shape)) for name, t in TENSORS.items()]
    buckets = plan_buckets(specs, bucket_size_bytes=2080)
    for bucket in buckets:
        acc = BucketChecksum()
        for entry in bucket.entries:
            acc.update(as_bytes(TENSORS[entry.name]))
        bucket.checksum = acc.hexdigest()
    return to_manifest(buckets, version, transport, disk_path, broadcast_chunk_bytes=chunk)


def _write_files(directory, manifest) -> None:
    for bucket in manifest.buckets:
        tensors = {spec.name: TENSORS[spec.name] for spec in bucket.tensors}
        save_file(tensors, str(directory / bucket_file_name(bucket.index, len(manifest.buckets))))


def test_servers_join_the_group_at_once_with_their_own_rank_offsets(tiny_model_dir, sglang_peer):
    peers = [sglang_peer(), sglang_peer()]
    both_inside = threading.Barrier(2, timeout=5)  # like a rendezvous: each call waits for the other

    def join(body):
        both_inside.wait()
        return 200, {"success": True, "message": "ok"}

    for peer in peers:
        peer.routes["/init_weights_update_group"] = join
    engine = _engine(tiny_model_dir, *peers)
    try:
        receiver = weight_receiver(engine)
        assert receiver.init_group(_spec()) == ([1, 2], False)
        assert receiver.init_group(_spec()) == ([1, 2], True)  # same spec: no second join
        bodies = [peer.calls("/init_weights_update_group") for peer in peers]
        assert [len(b) for b in bodies] == [1, 1]
        assert [b[0]["rank_offset"] for b in bodies] == [1, 2]
        assert {(b[0]["world_size"], b[0]["group_name"], b[0]["backend"]) for b in bodies} == {
            (3, "g1", "nccl")
        }
        with pytest.raises(InvalidArgument, match="group.world_size"):
            receiver.init_group(_spec(world_size=2))  # no room for two servers
    finally:
        engine.stop()


def test_servers_are_asked_to_join_only_once_the_store_is_this_groups(
    tiny_model_dir, sglang_peer, group_store, monkeypatch
):
    """On a fixed port the trainer may still host the previous group's store: the servers would
    join it and fail as it closes. The receiver waits until the store names this group."""
    group_store.set(HOST_KEY, "previous")
    seen = []
    info = group_module.log.info
    monkeypatch.setattr(
        group_module.log, "info", lambda event, **kw: (seen.append(kw.get("hosted")), info(event, **kw))
    )
    peer = sglang_peer()
    engine = _engine(tiny_model_dir, peer)
    try:
        receiver = weight_receiver(engine)
        joined = threading.Thread(target=receiver.init_group, args=(_spec(world_size=2),), daemon=True)
        joined.start()
        wait_until(
            lambda: "previous" in seen, timeout=30, what="the receiver to read the previous group's name"
        )
        assert joined.is_alive() and peer.calls("/init_weights_update_group") == []
        group_store.set(HOST_KEY, "g1")  # the trainer hosts this group now
        joined.join(30)
        assert not joined.is_alive() and len(peer.calls("/init_weights_update_group")) == 1
    finally:
        group_store.set(HOST_KEY, "g1")
        engine.stop()


def test_distributed_update_sends_each_bucket_as_a_flattened_bucket_then_commits(tiny_model_dir, sglang_peer):
    peer = sglang_peer()
    engine = _engine(tiny_model_dir, peer)
    try:
        receiver = weight_receiver(engine)
        receiver.init_group(_spec(world_size=2))
        reply = receiver.update(rollout_pb2.UpdateWeightsRequest(manifest=_manifest(4)))
        assert (reply.weight_version, engine.weight_version) == (4, 4)
        calls = peer.calls("/update_weights_from_distributed")
        assert [c["names"] for c in calls] == [["a.weight", "b.bias"], ["c.weight"]]
        assert calls[0]["dtypes"] == ["float32", "float32"] and calls[0]["shapes"] == [[64, 8], [8]]
        assert {(c["load_format"], c["group_name"], c["weight_version"]) for c in calls} == {
            ("flattened_bucket", "g1", "4")
        }
        with pytest.raises(InvalidArgument, match="broadcast_chunk_bytes"):
            receiver.update(rollout_pb2.UpdateWeightsRequest(manifest=_manifest(5, chunk=4096)))
        with pytest.raises(InvalidArgument, match="acknowledge"):
            receiver.update(rollout_pb2.UpdateWeightsRequest(manifest=_manifest(5), acknowledge=True))
        with pytest.raises(FailedPrecondition, match="only move forward"):
            receiver.update(rollout_pb2.UpdateWeightsRequest(manifest=_manifest(3)))
        peer.routes["/update_weights_from_distributed"] = lambda body: (
            400,
            {"success": False, "message": "oom"},
        )
        with pytest.raises(RollwayError) as err:
            receiver.update(rollout_pb2.UpdateWeightsRequest(manifest=_manifest(5)))
        assert err.value.code == grpc.StatusCode.UNAVAILABLE and "oom" in err.value.message
        assert engine.weight_version == 4
    finally:
        engine.stop()


def test_disk_update_verifies_the_files_before_sglang_loads_them(tiny_model_dir, sglang_peer, tmp_path):
    peer = sglang_peer()
    engine = _engine(tiny_model_dir, peer)
    try:
        receiver = weight_receiver(engine)
        manifest = _manifest(2, transport="disk", disk_path=str(tmp_path))
        _write_files(tmp_path, manifest)
        started = time.perf_counter()
        reply = receiver.update(rollout_pb2.UpdateWeightsRequest(manifest=manifest))
        assert reply.weight_version == 2 and reply.timings.verify_seconds <= time.perf_counter() - started
        assert peer.calls("/update_weights_from_disk") == [
            {"model_path": str(tmp_path), "weight_version": "2", "flush_cache": False}
        ]
        TENSORS["c.weight"][0, 0] += 1.0  # the files on disk no longer match a new manifest
        corrupt = _manifest(3, transport="disk", disk_path=str(tmp_path))
        TENSORS["c.weight"][0, 0] -= 1.0
        with pytest.raises(RollwayError) as err:
            receiver.update(rollout_pb2.UpdateWeightsRequest(manifest=corrupt))
        assert err.value.code == grpc.StatusCode.DATA_LOSS and "bucket(s) [1]" in err.value.message
        assert len(peer.calls("/update_weights_from_disk")) == 1 and engine.weight_version == 2
    finally:
        engine.stop()
