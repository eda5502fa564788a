"""The distributed transport's send side: trainer rank 0 broadcasts buckets on the weight group.

    plan:       base.checksum_pass: the manifest (layout + checksums) goes out before any byte moves
    broadcast:  every rank gathers again; rank 0 broadcasts bucket i on the weight group piece
                by piece (bucket_pieces) while bucket i+1 is gathered. Several ranks with
                row-sharded weights: each rank sends its byte ranges of a bucket straight into
                rank 0's buffer (gather.py). Otherwise tensor by tensor (full_tensor): small ones
                packed into one of two buffers, large ones sent from their memory

A DistributedSender is one run's: InitWeightGroup forms it with the group, and it keeps the group
and its two bucket buffers until the next InitWeightGroup or a failed push destroys the group.
Ranks other than 0 only take part in the gathers, in the same order. A failed broadcast (a
receiver died, the group timed out) never raises in the pass: rank 0 stops sending but keeps
gathering to the end, so the trainer's ranks stay in step, and reports the error in its result,
which DistributedSender turns into UNAVAILABLE (the coordinator rebuilds the group and retries).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rollway.common.errors import FailedPrecondition, Unavailable
from rollway.common.weight_sync.bucket_checksum import as_bytes
from rollway.common.weight_sync.buckets import Bucket, bucket_pieces, to_manifest
from rollway.common.weight_sync.group import (
    STATUS_ALREADY_APPLIED,
    STATUS_NAMES,
    STATUS_OK,
    WeightGroup,
    WeightGroupError,
)
from rollway.trainer.v1 import trainer_pb2
from rollway.trainer.weight_sync import gather as weight_gather
from rollway.trainer.weight_sync.base import Checksums, OnRanks, Sender, SendResult, gathered_tensors


class DistributedSender(Sender):
    """Plan (checksums) -> the manifest -> broadcast on the weight group -> every receiver committed.

    Owns the run's weight group (rank 0) and its two reusable bucket buffers (kept between pushes
    on the host)."""

    transport = "distributed"

    def __init__(self, group: WeightGroup):
        self.group = group
        self._buffers: list[torch.Tensor] = []

    def require_healthy(self) -> None:
        """FailedPrecondition if the group is broken (a failed collective, or destroyed)."""
        if self.group.broken:
            raise FailedPrecondition(
                f"the weight group is broken ({self.group.broken}); call InitWeightGroup again"
            )

    def close(self) -> None:
        """Destroy the group: members blocked in a collective on it fail at once."""
        self.group.destroy()
        self._buffers = []

    def send(self, on_ranks: OnRanks, request):
        version, chunk = request.weight_version, request.broadcast_chunk_bytes
        self.require_healthy()
        plan = on_ranks(Checksums())
        manifest = to_manifest(plan.buckets, version, self.transport, broadcast_chunk_bytes=chunk)
        yield trainer_pb2.PushWeightsResponse(manifest=manifest)
        step = Broadcast(request.acknowledge, chunk)
        sent = on_ranks(step, Broadcast(request.acknowledge, chunk, sender=self))
        self._check_delivery(version, sent)
        return plan, sent

    def _check_delivery(self, version: int, sent: SendResult) -> None:
        if sent.error:
            self.close()
            raise Unavailable(
                f"weight version {version} was not delivered ({sent.error}); receivers keep their "
                "version: call InitWeightGroup again, then retry"
            )
        refused = {rank: STATUS_NAMES.get(code, str(code)) for rank, code in enumerate(sent.receiver_status, 1)
                   if code not in (STATUS_OK, STATUS_ALREADY_APPLIED)}  # fmt: skip
        if refused:
            ranks = ", ".join(f"rank {rank}: {name}" for rank, name in refused.items())
            raise FailedPrecondition(
                f"weight version {version} was not committed by every receiver ({ranks})"
            )

    def buffers(self, size: int, device: torch.device) -> list[torch.Tensor]:
        if not self._buffers or self._buffers[0].numel() < size or self._buffers[0].device != device:
            self._buffers = []  # free the old pair first
            self._buffers = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]
        return self._buffers

    def release_device_buffers(self) -> None:
        """Accelerator memory is scarce: keep buffers between pushes only on the host."""
        if self._buffers and self._buffers[0].device.type != "cpu":
            self._buffers = []


def broadcast_pass(
    model: torch.nn.Module,
    buckets: list[Bucket],
    rank: int,
    sender: DistributedSender | None,
    acknowledge: bool,
    chunk_bytes: int = 0,
) -> SendResult | None:
    """Gather and broadcast every bucket (rank 0 sends); never raises on a send error.

    With several ranks and row-sharded weights each bucket is gathered by ranges into one of two
    alternating buffers (gather.py), then broadcast piece by piece (bucket_pieces) while
    the next one is gathered. Otherwise tensors are gathered one by one: small ones are packed
    into a buffer and broadcast as soon as a piece is complete; a tensor larger than `chunk_bytes`
    is broadcast straight from its own memory (0: each bucket is packed whole, one broadcast)."""
    ranges = (
        weight_gather.RangeGather(model, buckets, rank) if weight_gather.possible(model, buckets) else None
    )
    if rank != 0:
        if ranges is not None:
            for bucket in buckets:
                ranges.send(bucket)
        else:
            for _ in gathered_tensors(model, buckets, keep=False):
                pass
        return None
    result = SendResult(buckets=buckets, num_bytes=sum(b.num_bytes for b in buckets))
    group = sender.group
    buffers = sender.buffers(max(b.padded_size for b in buckets), group.device)
    started = time.perf_counter()
    if ranges is not None:
        in_flight = _send_ranged(ranges, buckets, group, buffers, chunk_bytes, result)
    else:
        in_flight = _send_by_tensor(model, buckets, group, buffers, chunk_bytes, result)
    for works in in_flight:
        result.error = result.error or _wait_all(works, group)
    if acknowledge and not result.error:
        try:
            result.receiver_status = group.exchange_status(STATUS_OK)[1:]
        except WeightGroupError as exc:
            result.error = str(exc)
    result.wire_seconds = time.perf_counter() - started - result.gather_seconds
    sender.release_device_buffers()
    return result


def _send_ranged(ranges, buckets, group, buffers, chunk_bytes: int, result: SendResult) -> list[list]:
    """Rank 0: gather bucket i whole (by ranges), then start its broadcasts; bucket i+1 is
    gathered into the other buffer while they run. Returns the broadcasts still in flight."""
    in_flight: list[list] = [[], []]  # (work, tensor kept alive) still reading each buffer
    for bucket in buckets:
        slot = bucket.index % 2
        result.error = result.error or _wait_all(in_flight[slot], group)  # bucket i-2 left this buffer
        in_flight[slot] = []
        tick = time.perf_counter()
        ranges.gather_into(bucket, buffers[slot])  # also after an error: the other ranks are sending
        result.gather_seconds += time.perf_counter() - tick
        for start, end in bucket_pieces(bucket, chunk_bytes):
            if result.error:
                break
            source = buffers[slot][start:end]
            work, result.error = _start(group, source)
            in_flight[slot].append((work, source))
    return in_flight


def _send_by_tensor(model, buckets, group, buffers, chunk_bytes: int, result: SendResult) -> list[list]:
    """Rank 0: gather tensor by tensor (full_tensor), broadcasting each piece of a bucket as soon
    as it is complete. Returns the broadcasts still in flight."""
    in_flight: list[list] = [[], []]  # (work, tensor kept alive) still reading each buffer's bucket
    gathered = gathered_tensors(model, buckets, keep=True)
    for bucket in buckets:
        slot = bucket.index % 2
        result.error = result.error or _wait_all(in_flight[slot], group)  # bucket i-2 left this buffer
        in_flight[slot] = []
        pieces = iter(bucket_pieces(bucket, chunk_bytes))
        piece = next(pieces, None)
        for _ in bucket.entries:
            tick = time.perf_counter()
            _, entry, full = next(gathered)
            data = as_bytes(full)
            end = entry.offset + entry.num_bytes
            direct = chunk_bytes and entry.num_bytes > chunk_bytes and full.device == buffers[slot].device
            if not direct and not result.error:
                buffers[slot][entry.offset : end].copy_(data)
            result.gather_seconds += time.perf_counter() - tick
            while piece is not None and piece[1] <= end and not result.error:
                source = (
                    data[piece[0] - entry.offset : piece[1] - entry.offset]
                    if direct
                    else buffers[slot][slice(*piece)]
                )
                work, result.error = _start(group, source)
                in_flight[slot].append((work, source))
                piece = next(pieces, None)
    return in_flight


def _start(group: WeightGroup, tensor: torch.Tensor):
    """(work, "") or (None, error)."""
    try:
        return group.broadcast(tensor), ""
    except RuntimeError as exc:
        group.mark_broken(str(exc))
        return None, f"broadcast failed: {str(exc).splitlines()[0]}"


def _wait_all(works: list, group: WeightGroup) -> str:
    """Wait for every (work, tensor) pair; the first error ("" if none)."""
    error = ""
    for work, _ in works:
        if work is None:
            continue
        try:
            group.wait(work)  # in slices: destroying the group (the trainer stopping) ends it
        except RuntimeError as exc:  # DistBackendError and gloo's errors are RuntimeErrors
            group.mark_broken(str(exc))
            error = error or f"broadcast failed: {str(exc).splitlines()[0]}"
    return error


@dataclass(frozen=True)
class Broadcast:
    """The broadcast step of a push on every trainer rank (broadcast_pass). `sender` is rank 0's
    group and buffers: only rank 0's step carries it (handed over directly, never pickled)."""

    acknowledge: bool
    chunk_bytes: int
    sender: DistributedSender | None = None
