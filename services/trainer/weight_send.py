"""The trainer's side of a weight update, run on every rank (TrainerEngine.weight_push -> here).

    plan:       every rank casts its own FSDP2 shards to the serving dtype and sums them into
                the buckets' checksums (linear in the bytes: no gather), one all-reduce adds the
                ranks' sums -> the manifest (layout + checksums) goes out before any byte moves
    broadcast:  every rank gathers again; rank 0 broadcasts bucket i on the weight group piece
                by piece (bucket_pieces) while bucket i+1 is gathered. Several ranks with
                row-sharded weights: each rank sends its byte ranges of a bucket straight into
                rank 0's buffer (weight_gather.py). Otherwise tensor by tensor (full_tensor):
                small ones packed into one of two buffers, large ones sent from their memory
    write:      every rank gathers; rank 0 writes one safetensors file per bucket (disk path,
                weight_write.py)

Two passes because the receivers need the per-bucket checksums in the manifest before the first
broadcast, and the alternative (holding the whole model in the serving dtype on rank 0) does not
fit on an accelerator. The plan pass reads each rank's shards once with a vectorised sum, in
parallel on all ranks, and gathers or copies nothing (bucket_checksum.py).

Ranks other than 0 only take part in the gathers, in the same order. A failed broadcast (a
receiver died, the group timed out) never raises here: rank 0 stops sending but keeps gathering
to the end, so the trainer's ranks stay in step, and reports the error in its result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rollway.common.bucket_checksum import as_bytes, format_digest, partial_sums
from rollway.common.weight_buckets import (
    Bucket,
    TensorEntry,
    bucket_pieces,
    dtype_name,
    plan_buckets,
)
from rollway.common.weight_group import STATUS_OK, WeightGroup, WeightGroupError
from rollway.common.weights_checksum import dtype_from_name
from rollway.trainer import weight_gather
from rollway.trainer.lora import adapters_by_weight, full, hf_named_tensors, merged
from rollway.trainer.weights import weight_names


@dataclass
class SendResult:
    """What rank 0 reports after a pass (other ranks return None)."""

    buckets: list[Bucket] = field(default_factory=list)
    gather_seconds: float = 0.0
    checksum_seconds: float = 0.0
    wire_seconds: float = 0.0
    num_bytes: int = 0
    error: str = ""
    receiver_status: list[int] = field(default_factory=list)  # acknowledgements of ranks 1..N-1


class SenderState:
    """Rank 0's weight group and its two reusable bucket buffers (kept between pushes on CPU)."""

    def __init__(self, group: WeightGroup | None):
        self.group = group
        self._buffers: list[torch.Tensor] = []

    def buffers(self, size: int, device: torch.device) -> list[torch.Tensor]:
        if not self._buffers or self._buffers[0].numel() < size or self._buffers[0].device != device:
            self._buffers = []  # free the old pair first
            self._buffers = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]
        return self._buffers

    def release_device_buffers(self) -> None:
        """Accelerator memory is scarce: keep buffers between pushes only on the host."""
        if self._buffers and self._buffers[0].device.type != "cpu":
            self._buffers = []


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights under their HF names; with LoRA the base weights (adapters are merged in on the way)."""
    return hf_named_tensors(model)


def plan_layout(model: torch.nn.Module, dtype: torch.dtype, bucket_size_bytes: int) -> list[Bucket]:
    """Buckets of the model's weights (parameters and persistent buffers, sorted, tied ones once).

    Floating-point tensors travel in `dtype`; others keep theirs. Same result on every rank."""
    tensors = _tensors(model)
    specs = []
    for name in weight_names(model):
        tensor = tensors[name]
        specs.append(
            TensorEntry(
                name, dtype_name(dtype if tensor.is_floating_point() else tensor.dtype), tuple(tensor.shape)
            )
        )
    return plan_buckets(specs, bucket_size_bytes)


def gathered_tensors(model: torch.nn.Module, buckets: list[Bucket], keep: bool):
    """(bucket, entry, full tensor in the entry's dtype or None) in order; every rank iterates it all."""
    tensors = _tensors(model)
    adapters = adapters_by_weight(model)
    for bucket in buckets:
        for entry in bucket.entries:
            tensor = tensors[entry.name].detach()
            if isinstance(tensor, DTensor):
                tensor = tensor.to_local() if tensor.device_mesh.size() == 1 else tensor.full_tensor()
            tensor = merged(tensor, adapters.get(entry.name))  # LoRA: W + scaling * B @ A
            yield bucket, entry, (tensor.to(entry.torch_dtype).contiguous() if keep else None)


def _local_piece(tensor: torch.Tensor, entry: TensorEntry, rank: int) -> tuple[torch.Tensor, int] | None:
    """(this rank's bytes of `tensor` in the serving dtype, their byte offset in the bucket), or
    None when another rank counts them. Collective only for placements other than a 1-D Shard(0)
    (every rank decides the same way: it depends on the placements alone)."""
    tensor = tensor.detach()
    if not isinstance(tensor, DTensor) or weight_gather.row_sharded(tensor):
        return weight_gather.own_range(tensor, entry, rank)
    full = tensor.full_tensor()  # e.g. HSDP: replicas would be counted twice
    return (as_bytes(full.to(entry.torch_dtype).contiguous()), entry.offset) if rank == 0 else None


def checksum_pass(model: torch.nn.Module, buckets: list[Bucket], rank: int) -> SendResult | None:
    """Fill each bucket's checksum (on rank 0) without gathering: every rank adds up the sums of
    its own shards (the checksum is linear in the bytes), then one all-reduce totals them."""
    started = time.perf_counter()
    tensors = _tensors(model)
    adapters = adapters_by_weight(model)
    sums = [[0, 0] for _ in buckets]
    for bucket in buckets:
        for entry in bucket.entries:
            if entry.name in adapters:  # a merged weight has no shards of its own: rank 0 counts it whole
                weight = merged(full(tensors[entry.name]), adapters[entry.name])
                piece = (
                    (as_bytes(weight.to(entry.torch_dtype).contiguous()), entry.offset) if rank == 0 else None
                )
            else:
                piece = _local_piece(tensors[entry.name], entry, rank)
            if piece is not None and piece[0].numel():
                s1, s2 = partial_sums(*piece)
                sums[bucket.index][0] += s1
                sums[bucket.index][1] += s2
    if dist.is_initialized() and dist.get_world_size() > 1:
        totals = torch.tensor([[_signed(v) for v in pair] for pair in sums], dtype=torch.int64)
        dist.all_reduce(totals)  # int64 sums wrap: still the sums mod 2**64
        sums = totals.tolist()
    if rank != 0:
        return None
    for bucket in buckets:
        bucket.checksum = format_digest(*sums[bucket.index])
    result = SendResult(buckets=buckets, num_bytes=sum(b.num_bytes for b in buckets))
    result.checksum_seconds = time.perf_counter() - started
    return result


def _signed(value: int) -> int:
    """A sum mod 2**64 as the int64 with the same bits."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def broadcast_pass(
    model: torch.nn.Module,
    buckets: list[Bucket],
    rank: int,
    sender: SenderState | None,
    acknowledge: bool,
    chunk_bytes: int = 0,
) -> SendResult | None:
    """Gather and broadcast every bucket (rank 0 sends); never raises on a send error.

    With several ranks and row-sharded weights each bucket is gathered by ranges into one of two
    alternating buffers (weight_gather.py), then broadcast piece by piece (bucket_pieces) while
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


def plan_weights(engine, dtype: str, bucket_size_bytes: int) -> SendResult | None:
    """The buckets of a push and their checksums (on rank 0), without gathering."""
    with torch.no_grad():
        buckets = plan_layout(engine.model, dtype_from_name(dtype), bucket_size_bytes)
        return checksum_pass(engine.model, buckets, engine.info.rank)


def broadcast_weights(
    engine,
    dtype: str,
    bucket_size_bytes: int,
    sender: SenderState | None,
    acknowledge: bool,
    chunk_bytes: int,
) -> SendResult | None:
    """Gather and broadcast every bucket over the weight group (rank 0 sends: `sender`)."""
    with torch.no_grad():
        buckets = plan_layout(engine.model, dtype_from_name(dtype), bucket_size_bytes)
        return broadcast_pass(engine.model, buckets, engine.info.rank, sender, acknowledge, chunk_bytes)
