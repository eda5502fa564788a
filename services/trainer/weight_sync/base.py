"""The interface of one weight transport's send side, and the passes every transport shares.

    plan_layout:    the model's weights in buckets (same result on every rank)
    checksum_pass:  every rank casts its own FSDP2 shards to the serving dtype and sums them into
                    the buckets' checksums (linear in the bytes: no gather), one all-reduce adds
                    the ranks' sums -> the manifest (layout + checksums)
    Sender:         a transport's PushWeights sequence on rank 0 (pusher.py runs it); the
                    passes every trainer rank runs are steps of the WeightPass command (passes.py)

Two passes for the distributed transport because the receivers need the per-bucket checksums in
the manifest before the first broadcast, and the alternative (holding the whole model in the
serving dtype on rank 0) does not fit on an accelerator. The plan pass reads each rank's shards
once with a vectorised sum, in parallel on all ranks, and gathers or copies nothing
(bucket_checksum.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rollway.common.weight_sync.bucket_checksum import as_bytes, format_digest, partial_sums
from rollway.common.weight_sync.buckets import Bucket, TensorEntry, dtype_name, plan_buckets
from rollway.trainer.lora import adapters_by_weight, full, hf_named_tensors, merged
from rollway.trainer.v1 import trainer_pb2
from rollway.trainer.weight_sync import gather as weight_gather
from rollway.trainer.weights import weight_names

OnRanks = Callable[..., "SendResult"]  # (step, rank0_step=None) -> rank 0's SendResult


class Sender:
    """One transport's send side for one run (registry.py: the request's transport -> its kind)."""

    transport = ""  # the name manifests carry (rollway.common.weight_sync.transports)

    @staticmethod
    def check(request: trainer_pb2.PushWeightsRequest) -> None:
        """Refuse (InvalidArgument) a request this transport cannot serve; before any work."""

    def send(
        self, on_ranks: OnRanks, request: trainer_pb2.PushWeightsRequest
    ) -> Generator[trainer_pb2.PushWeightsResponse, None, tuple[SendResult, SendResult]]:
        """Rank 0, holding the pusher's locks: yield the manifest once the receivers can act on it,
        deliver the weights, and return (plan result, send result) for the timings. Raises a
        RollwayError when the version was not delivered. `on_ranks(step, rank0_step)` runs a
        step of the push on every trainer rank (rank 0 may get its own) and returns rank 0's result."""
        raise NotImplementedError


@dataclass(frozen=True)
class Checksums:
    """The step every push starts with: the buckets' checksums (checksum_pass), for the manifest."""


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
