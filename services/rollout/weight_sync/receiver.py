"""The rollout service's side of weight sync: join the group, receive, verify, commit.

    InitWeightGroup(spec):   same spec as the live group -> no-op; else destroy it, join as rank_offset
    UpdateWeights(manifest): check it against the served model -> the manifest's transport
                             (registry.py: distributed.py, disk.py) receives and verifies every
                             bucket -> [acknowledge to the sender] -> every checksum matched:
                             swap the received tensors in, commit the version

The engine serves the old version until the commit. Versions only move forward: a manifest for
the served version still takes part in the transfer (the sender broadcasts to the whole group)
and is dropped (already_applied); a lower one is received and refused. Engines whose own
workers join the group (sglang) go through sglang.py instead.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from rollway.common.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    RollwayError,
)
from rollway.common.log import get_logger
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.buckets import Bucket, ManifestError, manifest_layout
from rollway.common.weight_sync.group import (
    STATUS_ALREADY_APPLIED,
    STATUS_CHECKSUM_MISMATCH,
    STATUS_OK,
    STATUS_REFUSED,
    GroupSpec,
    WeightGroup,
    WeightGroupError,
)
from rollway.rollout.engines.base import Engine, EngineError
from rollway.rollout.v1 import rollout_pb2
from rollway.rollout.weight_sync.base import WeightsCorrupt, check_against_model
from rollway.rollout.weight_sync.distributed import StagingPool
from rollway.rollout.weight_sync.registry import receiver_for
from rollway.rollout.weight_sync.sglang import SGLangReceiver

log = get_logger("rollway.rollout.weights")


def parse_group_spec(spec_pb: common_pb2.WeightGroupSpec, num_workers: int) -> GroupSpec:
    try:
        spec = GroupSpec.from_proto(spec_pb)
    except ValueError as exc:
        field, _, problem = str(exc).partition(": ")
        raise InvalidArgument(field, problem) from None
    if spec.rank_offset < 1:
        raise InvalidArgument("group.rank_offset", "must be at least 1 (rank 0 is the trainer)")
    if spec.rank_offset + num_workers > spec.world_size:
        raise InvalidArgument(
            "group.world_size",
            f"{spec.world_size} has no room for {num_workers} worker(s) from rank {spec.rank_offset}",
        )
    return spec


def group_error(exc: WeightGroupError) -> RollwayError:
    # Not UNAVAILABLE: clients retry that, and a lone retry of a collective join cannot succeed.
    return (DeadlineExceeded if "timeout" in str(exc).lower() else FailedPrecondition)(str(exc))


class WeightReceiver:
    """InitWeightGroup and UpdateWeights over one engine; one update or group change at a time."""

    def __init__(self, engine: Engine, auth_token: str = ""):
        self.engine = engine
        self.auth_token = auth_token  # members of a weight group prove a secret derived from it
        self.group: WeightGroup | None = None
        self.spec: GroupSpec | None = None
        self.pool = StagingPool()
        self.sglang = None if engine.receives_weights_in_process else SGLangReceiver(engine)
        self._lock = threading.Lock()
        self._cancel_join = threading.Event()  # set by close(): the join in progress fails at once

    @contextmanager
    def _exclusive(self, timeout: float):
        if not self._lock.acquire(timeout=timeout):
            raise FailedPrecondition("another weight update or group change is in progress")
        try:
            yield
        finally:
            self._lock.release()

    # --- InitWeightGroup ------------------------------------------------------------------
    def init_group(self, spec_pb: common_pb2.WeightGroupSpec) -> tuple[list[int], bool]:
        """(ranks of this service, already_initialized)."""
        spec = parse_group_spec(spec_pb, self.engine.num_workers)
        ranks = list(range(spec.rank_offset, spec.rank_offset + self.engine.num_workers))
        with self._exclusive(spec.timeout_seconds):
            healthy = self.sglang is not None or (self.group is not None and not self.group.broken)
            if spec == self.spec and healthy:
                return ranks, True
            self._cancel_join = cancel = threading.Event()
            self._leave()
            if self.sglang is not None:
                if spec.authenticate_members:  # the servers would never answer: the group would hang
                    raise FailedPrecondition(
                        "group.authenticate_members: SGLang servers join the group by themselves and "
                        "cannot prove the run's secret (the coordinator sets it false for them)"
                    )
                self.sglang.init_group(spec)
            else:
                try:
                    self.group = WeightGroup(
                        spec, rank=spec.rank_offset, cancel=cancel, auth_token=self.auth_token
                    )
                except WeightGroupError as exc:
                    raise group_error(exc) from None
            self.spec = spec
        log.info("joined weight group", group=spec.group_name, ranks=ranks, world_size=spec.world_size)
        return ranks, False

    def close(self) -> None:
        """Leave the group (the next update needs InitWeightGroup again). A join or a transfer in
        progress on another thread fails within a moment, so a stopping service never waits on one."""
        self._cancel_join.set()
        self._leave()
        # The staging sets are two copies of the weights: a closed run's receiver must not keep
        # them (the next run's receiver stages its own). The served model keeps the set it was
        # swapped onto through its own references, until the engine drops that model. No lock:
        # close() runs inside updates too, and a transfer in flight keeps its buffers referenced.
        self.pool.clear()

    def _leave(self) -> None:
        group, self.group, self.spec = self.group, None, None
        if group is not None:
            group.destroy()

    def release_staging(self) -> None:
        """Free the staging buffers (ReleaseMemory)."""
        with self._lock:
            self.pool.clear()

    # --- UpdateWeights --------------------------------------------------------------------
    def update(self, request: rollout_pb2.UpdateWeightsRequest) -> rollout_pb2.UpdateWeightsResponse:
        if not request.HasField("manifest"):
            raise InvalidArgument("manifest", "is required")
        manifest = request.manifest
        try:
            buckets = manifest_layout(manifest)
        except ManifestError as exc:
            raise InvalidArgument(exc.field, exc.problem) from None
        if request.acknowledge and (
            self.sglang is not None or not receiver_for(manifest.transport).acknowledges
        ):
            raise InvalidArgument(
                "acknowledge",
                f"needs the distributed transport and an in-process engine (not {self.engine.name})",
            )
        timeout = self.spec.timeout_seconds if self.spec else 60.0
        with self._exclusive(timeout):
            if self.sglang is not None:
                return self.sglang.update(manifest, buckets, self.spec)
            return self._update_in_process(manifest, buckets, request.acknowledge)

    def require_group(self) -> WeightGroup:
        """The live weight group; FailedPrecondition if there is none or it is broken."""
        if self.group is None:
            raise FailedPrecondition("no weight group: call InitWeightGroup first")
        if self.group.broken:
            raise FailedPrecondition(
                f"the weight group is broken ({self.group.broken}); call InitWeightGroup again"
            )
        return self.group

    def _status(self, version: int, buckets: list[Bucket]) -> tuple[int, RollwayError | None]:
        """What this update will do, decided before any byte arrives: (status code, refusal)."""
        try:
            served = self.engine.weight_tensors()
            required = {name for name, _ in self.engine.named_parameters()}
        except EngineError as exc:  # e.g. the weights are released
            return STATUS_REFUSED, FailedPrecondition(f"cannot load weights now: {exc}")
        problem = check_against_model(buckets, served, required)
        if problem:
            return STATUS_REFUSED, InvalidArgument("manifest", f"does not fit the served model: {problem}")
        current = self.engine.weight_version
        if version < current:
            return STATUS_REFUSED, FailedPrecondition(
                f"manifest.weight_version: {version} is older than the served version {current} "
                "(versions only move forward)"
            )
        return (STATUS_ALREADY_APPLIED if version == current else STATUS_OK), None

    def _update_in_process(self, manifest, buckets: list[Bucket], acknowledge: bool):
        started = time.perf_counter()
        version, current = manifest.weight_version, self.engine.weight_version
        status, refusal = self._status(version, buckets)
        delivery = receiver_for(manifest.transport).receive(self, manifest, buckets, status == STATUS_OK)
        received = delivery.result
        if status == STATUS_OK and received.bad_buckets:
            status = STATUS_CHECKSUM_MISMATCH
        if acknowledge:
            try:
                self.require_group().exchange_status(status)
            except WeightGroupError as exc:
                self.close()
                raise group_error(exc) from None
        timings = common_pb2.WeightSyncTimings(
            wire_seconds=received.wire_seconds, verify_seconds=received.verify_seconds
        )
        if refusal is not None:
            raise refusal
        if status == STATUS_CHECKSUM_MISMATCH:
            raise WeightsCorrupt(
                f"weight version {version}: checksum mismatch in bucket(s) {received.bad_buckets}; "
                f"not committed, still serving version {current}"
            )
        if status == STATUS_ALREADY_APPLIED:
            timings.total_seconds = time.perf_counter() - started
            return rollout_pb2.UpdateWeightsResponse(
                weight_version=current, already_applied=True, timings=timings
            )
        tick = time.perf_counter()
        self._load(delivery.named, delivery.pool_index)
        self.engine.weight_version = version
        timings.load_seconds = time.perf_counter() - tick
        timings.total_seconds = time.perf_counter() - started
        log.info("weights updated", weight_version=version, transport=manifest.transport,
                 num_buckets=len(buckets), seconds=round(timings.total_seconds, 3))  # fmt: skip
        return rollout_pb2.UpdateWeightsResponse(weight_version=version, timings=timings)

    def _load(self, named, pool_index: int | None) -> None:
        """Swap the staged tensors in (copied first only where the engine's device differs)."""
        served = self.engine.weight_tensors()
        on_device = [(name, tensor.to(served[name].device)) for name, tensor in named]
        try:
            self.engine.swap_weights(on_device)
        except EngineError as exc:  # checked before receiving; only a concurrent ReleaseMemory gets here
            raise FailedPrecondition(f"cannot load the weights: {exc}") from None
        same_device = all(a is b for (_, a), (_, b) in zip(named, on_device, strict=True))
        self.pool.live = pool_index if same_device else None
