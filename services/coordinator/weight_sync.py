"""The weight-sync sequence the coordinator drives (control over gRPC, bytes over torch.distributed).

    init_weight_group:  trainer.InitWeightGroup (rank 0, hosts the store)  ||  rollout_i.InitWeightGroup
    sync_weights(v):    rollout_i.Pause -> trainer.PushWeights(v) streams the manifest
                        -> rollout_i.UpdateWeights(manifest) while the trainer broadcasts buckets
                        -> each receiver verifies checksums and commits v -> rollout_i.Resume

The trainer and every receiver must be inside their collectives at the same time, so the calls
of one phase run concurrently. Versions only move forward; a retry of a committed version is a
no-op on both sides. On failure the receivers keep the old version and the caller may rebuild
the group (init_weight_group again) and retry.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rollway.common.log import get_logger
from rollway.common.v1 import common_pb2
from rollway.coordinator.remote import Services
from rollway.rollout.v1 import rollout_pb2
from rollway.trainer.v1 import trainer_pb2

log = get_logger("rollway.coordinator.weight_sync")


class WeightSyncError(RuntimeError):
    """A weight update failed; receivers still serve their previous version."""


@dataclass
class WeightSyncSettings:
    """How weights travel from the trainer to the engines."""

    transport: str = "distributed"
    bucket_size_bytes: int = 512 * 1024 * 1024
    dtype: str = ""
    disk_path: str = ""
    timeout_seconds: float = 300.0
    backend: str = "gloo"
    master_address: str = "127.0.0.1"
    master_port: int = 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_weight_group(
    services: Services, settings: WeightSyncSettings, group_name: str = "rollway"
) -> common_pb2.WeightGroupSpec:
    """Create the group: trainer rank 0 plus one rank per engine worker of every rollout service."""
    infos = services.rollout_info()
    port = settings.master_port or free_port(settings.master_address)
    world_size = 1 + sum(max(info.num_workers, 1) for info in infos)
    base = common_pb2.WeightGroupSpec(
        group_name=group_name,
        master_address=settings.master_address,
        master_port=port,
        world_size=world_size,
        backend=settings.backend,
        timeout_seconds=settings.timeout_seconds,
    )
    with ThreadPoolExecutor(1 + len(services.rollouts)) as pool:
        calls = [
            pool.submit(
                services.trainer.InitWeightGroup,
                trainer_pb2.InitWeightGroupRequest(group=base),
                timeout=settings.timeout_seconds + 30,
            )
        ]
        rank = 1
        for stub, info in zip(services.rollouts, infos, strict=True):
            spec = common_pb2.WeightGroupSpec()
            spec.CopyFrom(base)
            spec.rank_offset = rank
            rank += max(info.num_workers, 1)
            calls.append(
                pool.submit(
                    stub.InitWeightGroup,
                    rollout_pb2.InitWeightGroupRequest(group=spec),
                    timeout=settings.timeout_seconds + 30,
                )
            )
        for call in calls:
            call.result()
    log.info("weight group ready", world_size=world_size, port=port)
    return base


def sync_weights(services: Services, weight_version: int, settings: WeightSyncSettings) -> dict[str, float]:
    """Pause, push version `weight_version`, verify, commit, resume. Returns perf/weight_sync_* seconds."""
    start = time.perf_counter()
    for stub in services.rollouts:
        stub.Pause(rollout_pb2.PauseRequest(mode=rollout_pb2.PAUSE_MODE_WAIT))
    pause_seconds = time.perf_counter() - start
    try:
        receiver_timings = _push_and_receive(services, weight_version, settings)
    finally:
        for stub in services.rollouts:
            stub.Resume(rollout_pb2.ResumeRequest())
    sender, receivers = receiver_timings
    total = time.perf_counter() - start
    metrics = {
        "perf/weight_sync_gather_time": sender.gather_seconds,
        "perf/weight_sync_pause_time": pause_seconds,
        "perf/weight_sync_wire_time": max(
            [sender.wire_seconds, *(r.timings.wire_seconds for r in receivers)]
        ),
        "perf/weight_sync_load_time": max((r.timings.load_seconds for r in receivers), default=0.0),
        "perf/weight_sync_verify_time": max((r.timings.verify_seconds for r in receivers), default=0.0),
        "perf/weight_sync_time": total,
    }
    log.info("weights synced", weight_version=weight_version, seconds=round(total, 3))
    return metrics


def _push_and_receive(services: Services, weight_version: int, settings: WeightSyncSettings):
    request = trainer_pb2.PushWeightsRequest(
        weight_version=weight_version,
        bucket_size_bytes=settings.bucket_size_bytes,
        transport=settings.transport,
        disk_path=settings.disk_path,
        dtype=settings.dtype,
    )
    stream = services.trainer.PushWeights(request, timeout=settings.timeout_seconds)
    first = next(stream)
    if first.WhichOneof("payload") != "manifest":
        raise WeightSyncError("trainer.PushWeights did not start with a manifest")
    with ThreadPoolExecutor(max(len(services.rollouts), 1)) as pool:
        updates = [
            pool.submit(
                stub.UpdateWeights,
                rollout_pb2.UpdateWeightsRequest(manifest=first.manifest),
                timeout=settings.timeout_seconds,
            )
            for stub in services.rollouts
        ]
        sender = None
        for message in stream:
            if message.WhichOneof("payload") == "timings":
                sender = message.timings
        receivers = [u.result() for u in updates]
    if sender is None:
        raise WeightSyncError("trainer.PushWeights ended without timings")
    stale = [r.weight_version for r in receivers if r.weight_version != weight_version]
    if stale:
        raise WeightSyncError(f"receivers report versions {stale} after pushing {weight_version}")
    return sender, receivers
