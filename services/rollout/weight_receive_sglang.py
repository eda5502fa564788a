"""Weight sync for engines whose own workers join the weight group (SGLang servers).

    InitWeightGroup(spec):   POST /init_weights_update_group on every server at once
                             (server i joins as rank_offset + i * tp_size)
    UpdateWeights(manifest): distributed: per bucket, POST /update_weights_from_distributed with
                             load_format="flattened_bucket" on every server at once (SGLang
                             receives the packed bucket and loads it); disk: verify the files'
                             checksums here, then POST /update_weights_from_disk

What differs from the in-process receiver: SGLang loads each bucket as it arrives and cannot
show the received bytes, so the per-bucket checksums of a distributed update cannot be checked
(verify_seconds stays 0) and a transfer that fails half-way leaves the servers with a mix of
versions until the next successful update; generation is paused by the coordinator around the
update. A disk update is verified before SGLang reads it. No acknowledgement collective: the
servers take part in broadcasts only.
"""

from __future__ import annotations

import time

from rollway.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from rollway.common.log import get_logger
from rollway.common.v1 import common_pb2
from rollway.common.weight_buckets import Bucket
from rollway.common.weight_group import GroupSpec
from rollway.rollout.engines.base import EngineError
from rollway.rollout.v1 import rollout_pb2
from rollway.rollout.weight_staging import WeightsCorrupt, read_disk_buckets

log = get_logger("rollway.rollout.weights")
LOAD_FORMAT = "flattened_bucket"


class SGLangReceiver:
    """Drives an engine's weight endpoints (init_weights_update_group, update_weights_from_*)."""

    def __init__(self, engine):
        self.engine = engine

    def init_group(self, spec: GroupSpec) -> None:
        try:
            self.engine.init_weights_update_group(
                spec.master_address,
                spec.master_port,
                spec.rank_offset,
                spec.world_size,
                spec.group_name,
                spec.backend,
            )
        except EngineError as exc:
            raise FailedPrecondition(f"{self.engine.name}: cannot join the weight group: {exc}") from None

    def update(
        self, manifest: common_pb2.WeightManifest, buckets: list[Bucket], spec: GroupSpec | None
    ) -> rollout_pb2.UpdateWeightsResponse:
        started = time.perf_counter()
        version, current = manifest.weight_version, self.engine.weight_version
        if version < current:
            raise FailedPrecondition(
                f"manifest.weight_version: {version} is older than the served version {current} "
                "(versions only move forward)"
            )
        if manifest.broadcast_chunk_bytes:
            raise InvalidArgument(
                "manifest.broadcast_chunk_bytes", f"{self.engine.name} receives whole buckets only: must be 0"
            )
        timings = common_pb2.WeightSyncTimings()
        try:
            if manifest.transport == "distributed":
                self._receive(buckets, spec, version)
            else:
                timings.verify_seconds = self._verify_files(manifest.disk_path, buckets)
                self.engine.update_weights_from_disk(manifest.disk_path, version)
        except EngineError as exc:
            raise Unavailable(
                f"weight version {version} was not loaded by {self.engine.name}: {exc}"
            ) from None
        self.engine.weight_version = version
        timings.total_seconds = time.perf_counter() - started
        timings.wire_seconds = timings.total_seconds - timings.verify_seconds
        log.info(
            "weights updated", weight_version=version, transport=manifest.transport, engine=self.engine.name
        )
        return rollout_pb2.UpdateWeightsResponse(
            weight_version=version, already_applied=version == current, timings=timings
        )

    def _receive(self, buckets: list[Bucket], spec: GroupSpec | None, version: int) -> None:
        if spec is None:
            raise FailedPrecondition("no weight group: call InitWeightGroup first")
        for bucket in buckets:
            self.engine.update_weights_from_distributed(
                [e.name for e in bucket.entries],
                [e.dtype for e in bucket.entries],
                [list(e.shape) for e in bucket.entries],
                spec.group_name,
                version,
                load_format=LOAD_FORMAT,
            )

    @staticmethod
    def _verify_files(directory: str, buckets: list[Bucket]) -> float:
        try:
            _, result = read_disk_buckets(directory, buckets, keep=False)
        except (OSError, ValueError) as exc:
            raise FailedPrecondition(f"manifest.disk_path: {exc}") from None
        if result.bad_buckets:
            raise WeightsCorrupt(
                f"checksum mismatch in bucket(s) {result.bad_buckets} of {directory}; not loaded"
            )
        return result.verify_seconds
