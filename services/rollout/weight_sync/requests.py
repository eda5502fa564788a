"""What every receiver checks of a request before any byte moves, and its one-at-a-time rule
(receiver.py for engines that load weights in process, sglang.py for SGLang's servers)."""

from __future__ import annotations

import threading
from contextlib import contextmanager

from rollway.common.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, RollwayError
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.buckets import Bucket, ManifestError, manifest_layout
from rollway.common.weight_sync.group import GroupSpec, WeightGroupError
from rollway.rollout.v1 import rollout_pb2


def parse_group_spec(spec_pb: common_pb2.WeightGroupSpec, num_workers: int) -> GroupSpec:
    """The group an InitWeightGroup asks for, with room for this service's `num_workers` ranks."""
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


def parse_manifest(
    request: rollout_pb2.UpdateWeightsRequest,
) -> tuple[common_pb2.WeightManifest, list[Bucket]]:
    """An UpdateWeights request's manifest and its bucket layout; InvalidArgument naming the field."""
    if not request.HasField("manifest"):
        raise InvalidArgument("manifest", "is required")
    try:
        return request.manifest, manifest_layout(request.manifest)
    except ManifestError as exc:
        raise InvalidArgument(exc.field, exc.problem) from None


def group_error(exc: WeightGroupError) -> RollwayError:
    # Not UNAVAILABLE: clients retry that, and a lone retry of a collective join cannot succeed.
    return (DeadlineExceeded if "timeout" in str(exc).lower() else FailedPrecondition)(str(exc))


class OneAtATime:
    """One weight update or group change at a time; a second waits up to its timeout (-1: for as
    long as it takes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @contextmanager
    def __call__(self, timeout: float = -1):
        if not self._lock.acquire(timeout=timeout):
            raise FailedPrecondition("another weight update or group change is in progress")
        try:
            yield
        finally:
            self._lock.release()
