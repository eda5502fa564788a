"""The rollout service's side of weight sync: join the group, receive, verify, commit.

    InitWeightGroup(spec):   same spec as the live group -> no-op; else destroy it, join as rank_offset
    UpdateWeights(manifest): check it against the served model -> the manifest's transport
                             (registry.py: distributed.py, disk.py) receives and verifies every
                             bucket -> [acknowledge to the sender] -> every checksum matched:
                             swap the received tensors in, commit the version

The engine serves the old version until the commit. Versions only move forward: a manifest for
the served version still takes part in the transfer (the sender broadcasts to the whole group)
and is dropped (already_applied); a lower one is received and refused. Engines whose own
workers join the group (sglang) get an SGLangReceiver instead (sglang.py): `weight_receiver`
chooses once, from the engine.
"""

from __future__ import annotations

import threading
import time

from rollway.common.errors import FailedPrecondition, InvalidArgument, RollwayError, Unavailable
from rollway.common.log import get_logger
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.buckets import Bucket
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
from rollway.rollout.weight_sync.base import TransferFailed, WeightsCorrupt, check_against_model
from rollway.rollout.weight_sync.registry import receiver_kind
from rollway.rollout.weight_sync.requests import OneAtATime, group_error, parse_group_spec, parse_manifest
from rollway.rollout.weight_sync.sglang import SGLangReceiver
from rollway.rollout.weight_sync.staging import StagingPool

log = get_logger("rollway.rollout.weights")


def weight_receiver(engine: Engine, auth_token: str = "") -> WeightReceiver | SGLangReceiver:
    """The receiver of `engine`'s kind: in process, or its SGLang servers'."""
    if engine.receives_weights_in_process:
        return WeightReceiver(engine, auth_token)
    return SGLangReceiver(engine)


class WeightReceiver:
    """InitWeightGroup and UpdateWeights over an engine that loads weights in this process; one
    update or group change at a time."""

    def __init__(self, engine: Engine, auth_token: str = ""):
        self.engine = engine
        self.auth_token = auth_token  # members of a weight group prove a secret derived from it
        self.group: WeightGroup | None = None
        self.spec: GroupSpec | None = None
        self.pool = StagingPool()
        self._exclusive = OneAtATime()
        self._cancel_join = threading.Event()  # set by close(): the join in progress fails at once

    # --- InitWeightGroup ------------------------------------------------------------------
    def init_group(self, spec_pb: common_pb2.WeightGroupSpec) -> tuple[list[int], bool]:
        """(ranks of this service, already_initialized)."""
        spec = parse_group_spec(spec_pb, self.engine.num_workers)
        ranks = list(range(spec.rank_offset, spec.rank_offset + self.engine.num_workers))
        with self._exclusive(spec.timeout_seconds):
            if spec == self.spec and self.group is not None and not self.group.broken:
                return ranks, True
            self._cancel_join = cancel = threading.Event()
            self._leave()
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
        with self._exclusive():
            self.pool.clear()

    # --- UpdateWeights --------------------------------------------------------------------
    def update(self, request: rollout_pb2.UpdateWeightsRequest) -> rollout_pb2.UpdateWeightsResponse:
        manifest, buckets = parse_manifest(request)
        kind = receiver_kind(manifest.transport)
        timeout = self.spec.timeout_seconds if self.spec else 60.0
        with self._exclusive(timeout):
            receiver = kind(self.group, self.pool)  # this update's, on the run's group and buffers
            if request.acknowledge and not receiver.acknowledges:
                raise InvalidArgument(
                    "acknowledge", f"needs the distributed transport (not {manifest.transport!r})"
                )
            return self._update(receiver, manifest, buckets, request.acknowledge)

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

    def _update(self, receiver, manifest, buckets: list[Bucket], acknowledge: bool):
        started = time.perf_counter()
        version, current = manifest.weight_version, self.engine.weight_version
        status, refusal = self._status(version, buckets)
        try:
            delivery = receiver.receive(manifest, buckets, status == STATUS_OK)
        except TransferFailed as exc:
            self.close()
            raise Unavailable(
                f"weight version {version} was not received ({exc}); still serving version "
                f"{current}: call InitWeightGroup again"
            ) from None
        received = delivery.result
        if status == STATUS_OK and received.bad_buckets:
            status = STATUS_CHECKSUM_MISMATCH
        if acknowledge:  # the receiver received on the group: it is there and healthy
            try:
                self.group.exchange_status(status)
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
