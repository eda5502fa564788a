"""Gathering each bucket onto rank 0 point to point (the broadcast pass with several ranks).

With FSDP2's default placement (a 1-D mesh, Shard(0)) a rank's shard of a tensor is a block of
whole rows, that is one contiguous byte range of the tensor's place in the bucket. So instead of
an all-gather per tensor (every rank receives every other rank's shards, one blocking collective
per tensor, and gloo's all-gather runs at a fraction of its broadcast speed) each rank sends its
ranges straight into rank 0's bucket buffer: with N ranks rank 0 receives (N-1)/N of the bytes
and nobody else receives anything.

    every rank   cast its shard of each entry to the serving dtype -> (bucket offset, bytes)
    once         gather_object: rank 0 learns every rank's ranges (the receives to post)
    per bucket   rank 0 posts one irecv per range of ranks 1..N-1 into the bucket buffer and
                 copies its own ranges; ranks 1..N-1 isend theirs; both wait for the bucket

Used when every weight is a plain tensor (held whole on rank 0) or a 1-D Shard(0) DTensor and no
LoRA adapter must be merged in; otherwise `possible` is False and the broadcast pass gathers each
tensor with full_tensor(). Every rank decides the same way: it depends on placements alone.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from rollway.common.weight_sync.bucket_checksum import as_bytes
from rollway.common.weight_sync.buckets import Bucket, TensorEntry
from rollway.trainer.lora import adapters_by_weight, hf_named_tensors


def row_sharded(tensor: torch.Tensor) -> bool:
    return (
        isinstance(tensor, DTensor)
        and tensor.device_mesh.ndim == 1
        and tuple(tensor.placements) == (Shard(0),)
    )


def possible(model: torch.nn.Module, buckets: list[Bucket]) -> bool:
    """True when every weight of `buckets` can be gathered by ranges (see the module doc)."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or adapters_by_weight(model):
        return False
    tensors = hf_named_tensors(model)
    for bucket in buckets:
        for entry in bucket.entries:
            tensor = tensors[entry.name]
            if isinstance(tensor, DTensor) and not row_sharded(tensor):
                return False
    return True


def own_span(tensor: torch.Tensor, entry: TensorEntry, rank: int) -> tuple[int, int] | None:
    """(byte offset in the bucket, byte count) of this rank's part of a plain or row-sharded
    `tensor`, or None when this rank holds none of it (plain tensors: rank 0 holds them)."""
    if not isinstance(tensor, DTensor):
        return (entry.offset, entry.num_bytes) if rank == 0 else None
    local_shape, global_offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    if math.prod(local_shape) == 0:
        return None
    row_bytes = entry.num_bytes // tensor.shape[0]
    return entry.offset + global_offset[0] * row_bytes, local_shape[0] * row_bytes


def own_range(tensor: torch.Tensor, entry: TensorEntry, rank: int) -> tuple[torch.Tensor, int] | None:
    """(this rank's bytes of a plain or row-sharded `tensor` in the serving dtype, their byte
    offset in the bucket), or None when this rank holds none of it."""
    span = own_span(tensor, entry, rank)
    if span is None:
        return None
    tensor = tensor.detach()
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return as_bytes(local.to(entry.torch_dtype).contiguous()), span[0]


class RangeGather:
    """One pass's gathers: construct on every rank (a collective), then call `gather_into` on
    rank 0 and `send` on the others for each bucket, in bucket order."""

    def __init__(self, model: torch.nn.Module, buckets: list[Bucket], rank: int):
        self.rank = rank
        self._tensors = hf_named_tensors(model)
        own = [[s for e in b.entries if (s := own_span(self._tensors[e.name], e, rank))] for b in buckets]
        everyone = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(own, everyone, dst=0)
        # rank 0: per bucket, the (source rank, byte offset, byte count) of every range to receive
        self._incoming: list[list[tuple[int, int, int]]] = (
            [
                [(src, o, n) for src in range(1, len(everyone)) for o, n in everyone[src][b.index]]
                for b in buckets
            ]
            if rank == 0
            else []
        )

    def _own_ranges(self, bucket: Bucket) -> list[tuple[torch.Tensor, int]]:
        ranges = (own_range(self._tensors[e.name], e, self.rank) for e in bucket.entries)
        return [r for r in ranges if r is not None]

    def gather_into(self, bucket: Bucket, buffer: torch.Tensor) -> None:
        """Rank 0: fill buffer[:bucket.num_bytes] with the bucket's bytes from every rank."""
        works = [
            dist.irecv(buffer[offset : offset + count], src=src)
            for src, offset, count in self._incoming[bucket.index]
        ]
        for data, offset in self._own_ranges(bucket):
            buffer[offset : offset + data.numel()].copy_(data)
        for work in works:
            work.wait()

    def send(self, bucket: Bucket) -> None:
        """Ranks 1..N-1: send this rank's ranges of the bucket to rank 0."""
        ranges = self._own_ranges(bucket)  # kept alive until the sends complete
        works = [dist.isend(data, dst=0) for data, _ in ranges]
        for work in works:
            work.wait()
