"""Weight sync from a trainer with 2 FSDP2 ranks: every rank gathers, rank 0 alone sends.

Buckets of 64 KiB make many buckets, so the gathers of both passes and the double-buffered
broadcast interleave many times; a rank out of step would hang the all-gathers (the ranks have
a 60 s timeout) instead of passing.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from google.protobuf import struct_pb2
from support.processes import ServiceProcess
from support.trainer_steps import train_sft_step as train

from rollway.coordinator.remote import Services
from rollway.coordinator.weight_sync import WeightSyncSettings, init_weight_group, sync_weights
from rollway.rollout.v1 import rollout_pb2
from rollway.trainer.v1 import trainer_pb2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def services(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("weight-sync-ranks")
    trainer = ServiceProcess(
        "trainer",
        ["--hf-checkpoint", str(tiny_model_dir), "--dtype", "float32", "--world-size", "2"]
        + ["--distributed-timeout-seconds", "60"],
        workdir,
    )
    rollout = ServiceProcess(
        "rollout", ["--hf-checkpoint", str(tiny_model_dir), "--dtype", "float32", "--reward", "none"], workdir
    )
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(ServiceProcess.start, [trainer, rollout]))
    try:
        connected = Services.connect(trainer=trainer.address, rollouts=[rollout.address])
        config = struct_pb2.Struct()
        config.update({"lr": 0.02, "clip_grad": 0.0})
        connected.trainer.Init(trainer_pb2.InitRequest(config=config))
        yield connected
        connected.close()
    finally:
        trainer.stop()
        rollout.stop()


def in_sync(services: Services) -> bool:
    trainer = services.trainer.WeightChecksum(trainer_pb2.WeightChecksumRequest(dtype="float32")).checksum
    engine = services.rollouts[0].WeightChecksum(rollout_pb2.WeightChecksumRequest(dtype="float32")).checksum
    return (trainer.digest, trainer.num_tensors) == (engine.digest, engine.num_tensors)


def test_two_trainer_ranks_push_over_the_group_and_to_disk(services, tmp_path):
    settings = WeightSyncSettings(bucket_size_bytes=64 * 1024, timeout_seconds=30, max_attempts=1)
    init_weight_group(services, settings)
    train(services, 0)
    assert not in_sync(services)
    metrics = sync_weights(services, 1, settings)
    assert in_sync(services) and metrics["perf/weight_sync_gather_time"] > 0
    train(services, 1)
    disk = WeightSyncSettings(
        transport="disk", disk_path=str(tmp_path), bucket_size_bytes=1 << 20, max_attempts=1
    )
    sync_weights(services, 2, disk)
    assert in_sync(services)
    train(services, 2)  # the trainer still trains after both pushes: its ranks are in step
    sync_weights(services, 3, settings)
    assert in_sync(services)
    assert services.rollouts[0].GetInfo(rollout_pb2.GetInfoRequest()).weight_version == 3
