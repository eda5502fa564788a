"""The distributed transport's receive side: trainer rank 0 broadcasts buckets on the weight group.

    post recv(pieces 0..3) ─> wait(0) ─> post recv(4) ─> checksum(0) ─> wait(1) ─> post recv(5) ─> ...

A piece is a bucket (manifest.broadcast_chunk_bytes 0) or a consecutive part of one
(rollway.common.weight_sync.buckets.bucket_pieces, the same function the sender uses).

Buckets land in staging buffers that the served model does not use (staging.py), so the engine
keeps serving the old weights until every checksum matched.

Tests inject faults (a slow receiver, a flipped byte) by registering a receiver that wraps the
group this one receives on (tests/support/weight_faults.py), never through this loop.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from rollway.common.errors import FailedPrecondition
from rollway.common.log import get_logger
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.bucket_checksum import BucketChecksum
from rollway.common.weight_sync.buckets import Bucket, bucket_pieces, bucket_views
from rollway.common.weight_sync.group import WeightGroup, WeightGroupError
from rollway.rollout.weight_sync.base import Received, Receiver, ReceiveResult, TransferFailed

log = get_logger("rollway.rollout.weights")
PIECES_IN_FLIGHT = 4  # receives posted ahead, so the next pieces arrive while one is verified


def receive_buckets(
    group: WeightGroup, buckets: list[Bucket], buffers: list[torch.Tensor], verify: bool, chunk_bytes: int = 0
) -> ReceiveResult:
    """Receive every bucket from rank 0 into `buffers`, piece by piece (bucket_pieces; chunk_bytes
    0: whole buckets), keeping a few pieces in flight; each arrived piece is added to its
    bucket's checksum while the next ones arrive.

    Raises WeightGroupError (the group is then broken) if a transfer fails or times out."""
    pieces = [(b, start, end) for b in buckets for start, end in bucket_pieces(b, chunk_bytes)]
    result = ReceiveResult(bad_buckets=[])
    started = time.perf_counter()
    pending: deque = deque()
    checksum = BucketChecksum()
    next_index = 0

    def post_next() -> None:
        nonlocal next_index
        bucket, start, end = pieces[next_index]
        next_index += 1
        pending.append((bucket, start, end, group.broadcast(buffers[bucket.index][start:end], src=0)))

    try:
        while next_index < min(PIECES_IN_FLIGHT, len(pieces)):
            post_next()
        while pending:
            bucket, start, end, work = pending.popleft()
            group.wait(work)  # in slices: leaving the group (a stopping service) ends the wait
            if next_index < len(pieces):
                post_next()
            if verify:
                tick = time.perf_counter()
                checksum.update(buffers[bucket.index][start:end])
                if end == bucket.num_bytes:
                    if checksum.hexdigest() != bucket.checksum:
                        result.bad_buckets.append(bucket.index)
                    checksum = BucketChecksum()
                result.verify_seconds += time.perf_counter() - tick
    except RuntimeError as exc:
        group.mark_broken(str(exc))
        where = f"piece {next_index - len(pending)} of {len(pieces)}"
        raise WeightGroupError(f"{where}: {str(exc).splitlines()[0]}") from None
    result.wire_seconds = time.perf_counter() - started - result.verify_seconds
    return result


class DistributedReceiver(Receiver):
    """Receive every bucket on the run's weight group into a staging set, verifying as they arrive."""

    acknowledges = True

    def receive(self, manifest: common_pb2.WeightManifest, buckets: list[Bucket], apply: bool) -> Received:
        group = self.healthy_group()
        pool_index, buffers = self.pool.take(buckets, group.device)
        log.info("receiving weights", weight_version=manifest.weight_version, num_buckets=len(buckets))
        try:
            result = receive_buckets(group, buckets, buffers, apply, manifest.broadcast_chunk_bytes)
        except WeightGroupError as exc:
            raise TransferFailed(str(exc)) from None
        named = [view for bucket in buckets for view in bucket_views(buffers[bucket.index], bucket)]
        return Received(named, result, pool_index)

    def healthy_group(self) -> WeightGroup:
        """The group to receive on; FailedPrecondition if there is none or it is broken."""
        if self.group is None:
            raise FailedPrecondition("no weight group: call InitWeightGroup first")
        if self.group.broken:
            raise FailedPrecondition(
                f"the weight group is broken ({self.group.broken}); call InitWeightGroup again"
            )
        return self.group
