"""The weight-sync sequence the coordinator drives (control over gRPC, bytes over torch.distributed).

    init_weight_group:  rollout_i.GetInfo (all alive?) -> trainer.InitWeightGroup (rank 0, hosts
                        the store)  ||  rollout_i.InitWeightGroup (ranks 1..), all at once
    sync_weights(v):    rollout_i.GetInfo: all at v already -> no-op (a retry)
                        rollout_i.Pause(WAIT) -> trainer.PushWeights(v) streams the manifest
                        -> rollout_i.UpdateWeights(manifest) while the trainer broadcasts buckets
                        -> each receiver verifies its checksums [and acknowledges] and commits v
                        -> rollout_i.Resume (also after a failure)

    heal_engines(v):    rollout_i.GetInfo: workers awaiting weights (an SGLang server restarted by
                        its rollout service, or left half-updated) -> rebuild the group -> push v
                        again without pausing (the other workers already serve v)

The trainer and every receiver must be inside their collectives at the same time, so the calls
of one phase run concurrently. Versions only move forward; a retry of a committed version is a
no-op. On a failed transfer the receivers keep their old version; sync_weights then rebuilds the
group under a new name (every member destroys its old group first) and retries, up to
`max_attempts` in all, before raising WeightSyncError. The disk transport needs no group.
"""

from __future__ import annotations

import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from rollway.common.log import get_logger
from rollway.common.tracing import in_current_context
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.transports import TRANSPORTS
from rollway.coordinator.remote import Services
from rollway.rollout.v1 import rollout_pb2
from rollway.trainer.v1 import trainer_pb2

log = get_logger("rollway.coordinator.weight_sync")
# Seconds added to the group timeout for the RPC deadlines (the services time out first).
DEADLINE_MARGIN = 30.0


class WeightSyncError(RuntimeError):
    """A weight update failed; receivers still serve their previous version.

    `retryable`: the transfer itself failed (a member died or timed out): rebuilding the group
    may help; otherwise (a refusal, a checksum mismatch) the same request would fail again."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


@dataclass
class WeightSyncSettings:
    """How weights travel from the trainer to the engines."""

    transport: str = "distributed"
    bucket_size_bytes: int = 512 * 1024 * 1024
    dtype: str = ""  # empty: the engines' serving dtype (GetInfo.dtype)
    disk_path: str = ""
    timeout_seconds: float = 300.0
    backend: str = "auto"  # auto: nccl when every engine receives on nccl (SGLang on GPUs), else gloo
    master_address: str = "127.0.0.1"
    master_port: int = 0  # 0: a free port, new for every group
    group_name_prefix: str = "rollway"
    # Broadcast buckets in pieces of this size when every receiver is in-process (hf), so packing,
    # sending and verifying overlap; SGLang receives whole buckets (0).
    broadcast_chunk_bytes: int = 16 * 1024 * 1024
    max_attempts: int = 2  # sync attempts; between two, the group is rebuilt


def free_port(host: str = "127.0.0.1") -> int:
    """A free port on `host`; for a host that is not this machine's, a free port here (a guess)."""
    with socket.socket() as s:
        try:
            s.bind((host, 0))
        except OSError:  # the trainer is on another host: set update_weight_master_port there
            s.bind(("", 0))
        return s.getsockname()[1]


def _describe(exc: grpc.RpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"


def _rollout_infos(services: Services) -> list[rollout_pb2.GetInfoResponse]:
    infos = []
    for i, stub in enumerate(services.rollouts):
        try:
            infos.append(stub.GetInfo(rollout_pb2.GetInfoRequest()))
        except grpc.RpcError as exc:
            address = services.addresses.get("rollout", ["?"] * (i + 1))[i]
            raise WeightSyncError(f"rollout {i} ({address}) does not answer: {_describe(exc)}") from None
    return infos


def _backend(settings: WeightSyncSettings, infos: list[rollout_pb2.GetInfoResponse]) -> str:
    if settings.backend != "auto":
        return settings.backend
    return "nccl" if infos and all(info.weight_sync_backend == "nccl" for info in infos) else "gloo"


def init_weight_group(
    services: Services, settings: WeightSyncSettings, group_name: str | None = None
) -> common_pb2.WeightGroupSpec | None:
    """Form the group: trainer rank 0 plus one rank per engine worker of every rollout service.

    Every call uses a new group name (and, with master_port 0, a new port), so every member
    rebuilds: a member that restarted can never meet a stale group. None for the disk transport."""
    if not TRANSPORTS[settings.transport].uses_group:
        return None
    infos = _rollout_infos(services)  # a dead service fails here, before anyone blocks in a rendezvous
    base = common_pb2.WeightGroupSpec(
        group_name=group_name or f"{settings.group_name_prefix}-{uuid.uuid4().hex[:8]}",
        master_address=settings.master_address,
        master_port=settings.master_port or free_port(settings.master_address),
        world_size=1 + sum(max(info.num_workers, 1) for info in infos),
        backend=_backend(settings, infos),
        timeout_seconds=settings.timeout_seconds,
        # rollway's receivers answer the members' proof; an SGLang server joins by itself and cannot.
        authenticate_members=all(info.acknowledges_weight_updates for info in infos),
    )
    deadline = settings.timeout_seconds + DEADLINE_MARGIN
    with ThreadPoolExecutor(1 + len(services.rollouts)) as pool:
        calls = [("trainer", pool.submit(in_current_context(services.trainer.InitWeightGroup), trainer_pb2.InitWeightGroupRequest(group=base), timeout=deadline))]  # fmt: skip
        rank = 1
        for i, (stub, info) in enumerate(zip(services.rollouts, infos, strict=True)):
            spec = common_pb2.WeightGroupSpec()
            spec.CopyFrom(base)
            spec.rank_offset = rank
            rank += max(info.num_workers, 1)
            request = rollout_pb2.InitWeightGroupRequest(group=spec)
            calls.append(
                (
                    f"rollout {i}",
                    pool.submit(in_current_context(stub.InitWeightGroup), request, timeout=deadline),
                )
            )
        errors = []
        for who, call in calls:
            try:
                call.result()
            except grpc.RpcError as exc:
                errors.append(f"{who}: {_describe(exc)}")
    if errors:
        raise WeightSyncError(
            f"weight group {base.group_name} not formed: " + "; ".join(errors), retryable=True
        )
    log.info("weight group ready", group=base.group_name, world_size=base.world_size, backend=base.backend)
    return base


def sync_weights(
    services: Services, weight_version: int, settings: WeightSyncSettings, pause: bool = True
) -> dict[str, float]:
    """Pause, push `weight_version`, verify, commit, resume; perf/weight_sync_* seconds.

    A version every engine already serves is a no-op. Raises WeightSyncError when the update
    did not reach every engine after `max_attempts` (each engine then serves its old version)."""
    for attempt in range(1, settings.max_attempts + 1):
        try:
            return _sync_once(services, weight_version, settings, pause)
        except WeightSyncError as exc:
            if not exc.retryable or attempt == settings.max_attempts:
                raise
            log.warning("weight sync failed; rebuilding the group", error=str(exc), attempt=attempt)
            init_weight_group(services, settings)
    raise AssertionError("unreachable")


def heal_engines(services: Services, weight_version: int, settings: WeightSyncSettings) -> bool:
    """Give `weight_version` to engine workers that lost it (restarted, or half-updated by a failed
    update): they generate nothing until then. Rebuilds the group (a restarted server is not in
    it) and pushes without pausing: every other worker already serves these very weights. True
    when it pushed."""
    infos = _rollout_infos(services)
    awaiting = {i: info.num_workers_awaiting_weights for i, info in enumerate(infos)}
    awaiting = {i: n for i, n in awaiting.items() if n}
    if not awaiting or weight_version == 0:
        return False
    log.warning("engine workers await the current weights; rebuilding the group",
                weight_version=weight_version, rollouts=awaiting)  # fmt: skip
    sync_weights(services, weight_version, settings, pause=False)
    return True


def _sync_once(
    services: Services, weight_version: int, settings: WeightSyncSettings, pause: bool = True
) -> dict[str, float]:
    start = time.perf_counter()
    infos = _rollout_infos(services)
    versions = [info.weight_version for info in infos]
    ahead = [(i, v) for i, v in enumerate(versions) if v > weight_version]
    if ahead:
        raise WeightSyncError(
            f"rollout(s) {ahead} serve versions above {weight_version}: versions only move forward"
        )
    awaiting = any(info.num_workers_awaiting_weights for info in infos)
    if versions and all(v == weight_version for v in versions) and not awaiting:
        log.info("weights already synced", weight_version=weight_version)
        return _metrics(None, [], 0.0, time.perf_counter() - start)
    if awaiting and TRANSPORTS[settings.transport].uses_group:
        init_weight_group(services, settings)  # a restarted worker is in no group yet
    paused = []
    try:
        for stub in services.rollouts if pause else []:
            stub.Pause(
                rollout_pb2.PauseRequest(mode=rollout_pb2.PAUSE_MODE_WAIT), timeout=settings.timeout_seconds
            )
            paused.append(stub)
        pause_seconds = time.perf_counter() - start
        sender, receivers = _push_and_receive(services, weight_version, settings, infos)
    except grpc.RpcError as exc:  # Pause
        raise WeightSyncError(f"pause before the weight update failed: {_describe(exc)}") from None
    finally:
        for stub in paused:
            try:
                stub.Resume(rollout_pb2.ResumeRequest())
            except grpc.RpcError as exc:
                log.error("resume after the weight update failed", error=_describe(exc))
    metrics = _metrics(sender, receivers, pause_seconds, time.perf_counter() - start)
    log.info(
        "weights synced", weight_version=weight_version, seconds=round(metrics["perf/weight_sync_time"], 3)
    )
    return metrics


def _metrics(sender, receivers, pause_seconds: float, total: float) -> dict[str, float]:
    timings = [r.timings for r in receivers]
    return {
        "perf/weight_sync_gather_time": sender.gather_seconds if sender else 0.0,
        "perf/weight_sync_pause_time": pause_seconds,
        "perf/weight_sync_wire_time": max(
            [sender.wire_seconds if sender else 0.0, *(t.wire_seconds for t in timings)]
        ),
        "perf/weight_sync_load_time": max((t.load_seconds for t in timings), default=0.0),
        "perf/weight_sync_verify_time": max((t.verify_seconds for t in timings), default=0.0),
        "perf/weight_sync_time": total,
        **sync_volume(sender),
    }


def sync_volume(sender) -> dict[str, float]:
    """The push's size and the transport's bandwidth over its wire time (decimal GB/s, as
    network links are quoted); none where nothing was sent."""
    if sender is None or not sender.num_bytes:
        return {}
    volume = {"perf/weight_sync_bytes": float(sender.num_bytes)}
    if sender.wire_seconds > 0:
        volume["perf/weight_sync_gbytes_per_s"] = sender.num_bytes / sender.wire_seconds / 1e9
    return volume


def _push_and_receive(services: Services, weight_version: int, settings: WeightSyncSettings, infos):
    acknowledge = TRANSPORTS[settings.transport].uses_group and all(
        info.acknowledges_weight_updates for info in infos
    )
    dtypes = {info.dtype for info in infos}
    if not settings.dtype and len(dtypes) > 1:
        raise WeightSyncError(
            f"the rollout services serve different dtypes {sorted(dtypes)}: set the sync dtype"
        )
    request = trainer_pb2.PushWeightsRequest(
        weight_version=weight_version,
        bucket_size_bytes=settings.bucket_size_bytes,
        transport=settings.transport,
        disk_path=settings.disk_path,
        dtype=settings.dtype or (dtypes.pop() if dtypes else ""),
        acknowledge=acknowledge,
        broadcast_chunk_bytes=settings.broadcast_chunk_bytes if acknowledge else 0,
    )
    deadline = 2 * settings.timeout_seconds + DEADLINE_MARGIN
    # Tracked: a dead or hung rollout cancels it, instead of waiting for the broadcast's timeout.
    stream = services.track(services.trainer.PushWeights(request, timeout=deadline))
    try:
        return _receive(services, stream, weight_version, acknowledge, deadline)
    finally:
        services.untrack(stream)


def _receive(services: Services, stream, weight_version: int, acknowledge: bool, deadline: float):
    """The rollouts' UpdateWeights while the trainer's PushWeights stream goes on."""
    try:
        first = next(stream)
    except grpc.RpcError as exc:
        raise WeightSyncError(f"trainer.PushWeights: {_describe(exc)}", _retryable(exc)) from None
    if first.WhichOneof("payload") != "manifest":
        raise WeightSyncError("trainer.PushWeights did not start with a manifest")
    update = rollout_pb2.UpdateWeightsRequest(manifest=first.manifest, acknowledge=acknowledge)
    with ThreadPoolExecutor(max(len(services.rollouts), 1)) as pool:
        updates = [
            pool.submit(in_current_context(stub.UpdateWeights), update, timeout=deadline)
            for stub in services.rollouts
        ]
        sender, errors, retryable = None, [], False
        try:
            for message in stream:
                if message.WhichOneof("payload") == "timings":
                    sender = message.timings
        except grpc.RpcError as exc:
            errors.append(f"trainer: {_describe(exc)}")
            retryable = _retryable(exc)
        receivers = []
        for i, future in enumerate(updates):
            try:
                receivers.append(future.result())
            except grpc.RpcError as exc:
                errors.append(f"rollout {i}: {_describe(exc)}")
                retryable = retryable or _retryable(exc)
    if errors:
        raise WeightSyncError(f"weight version {weight_version} not synced: " + "; ".join(errors), retryable)
    if sender is None:
        raise WeightSyncError("trainer.PushWeights ended without timings")
    stale = [r.weight_version for r in receivers if r.weight_version != weight_version]
    if stale:
        raise WeightSyncError(f"receivers report versions {stale} after pushing {weight_version}")
    return sender, receivers


def _retryable(exc: grpc.RpcError) -> bool:
    """A failed or timed-out transfer (a rebuilt group may succeed), not a refusal."""
    return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
