"""The bucket layout of a weight update, shared by the sender (trainer) and the receivers.

    specs  = [TensorSpec(name, dtype, shape), ...]           in send order
    layout = plan_buckets(specs, bucket_size_bytes)          -> [Bucket(index, num_bytes, entries)]
    views  = bucket_views(buffer, bucket)                    -> [(name, tensor view into buffer)]

Tensors are packed back to back, without padding, in the order given (each bucket's bytes are
exactly what SGLang's FlattenedTensorBucket expects for `load_format="flattened_bucket"`); a
bucket holds tensors until the next one would exceed `bucket_size_bytes`, and a tensor larger
than that travels alone. All tensors of an update have the serving dtype, so every tensor
starts at a multiple of its element size. Buffers are allocated `padded_size` bytes (num_bytes
rounded up to a whole word); only num_bytes are sent and checksummed.

`manifest_layout` reads a WeightManifest back into buckets and refuses one that is not
self-consistent (the receiver must know exactly how many bytes each broadcast carries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.bucket_checksum import ALGORITHM, WORD_BYTES
from rollway.common.weight_sync.transports import TRANSPORTS
from rollway.common.weights_checksum import dtype_from_name

DEFAULT_BUCKET_SIZE_BYTES = 512 * 1024 * 1024


class ManifestError(ValueError):
    """A manifest that cannot be received: `field` names the offending manifest field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class TensorEntry:
    """One tensor inside a bucket."""

    name: str
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int = 0
    num_bytes: int = 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)


@dataclass
class Bucket:
    """One flat buffer sent in a single broadcast (or one safetensors file on disk)."""

    index: int
    num_bytes: int
    entries: list[TensorEntry]
    checksum: str = ""

    @property
    def padded_size(self) -> int:
        """Bytes to allocate: num_bytes rounded up to a whole word (at least one)."""
        return max(WORD_BYTES, math.ceil(self.num_bytes / WORD_BYTES) * WORD_BYTES)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_num_bytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def plan_buckets(specs: list[TensorEntry], bucket_size_bytes: int) -> list[Bucket]:
    """Pack `specs` (offsets ignored) into buckets of at most `bucket_size_bytes`, in order."""
    if bucket_size_bytes <= 0:
        raise ValueError(f"bucket_size_bytes: must be positive (got {bucket_size_bytes})")
    buckets: list[Bucket] = []
    current: list[TensorEntry] = []
    offset = 0
    for spec in specs:
        size = tensor_num_bytes(spec.torch_dtype, spec.shape)
        if current and offset + size > bucket_size_bytes:
            buckets.append(Bucket(len(buckets), offset, current))
            current, offset = [], 0
        current.append(TensorEntry(spec.name, spec.dtype, tuple(spec.shape), offset, size))
        offset += size
    if current:
        buckets.append(Bucket(len(buckets), offset, current))
    return buckets


def bucket_views(buffer: torch.Tensor, bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into a flat uint8 `buffer` holding `bucket` (no copies)."""
    return [
        (e.name, buffer[e.offset : e.offset + e.num_bytes].view(e.torch_dtype).view(e.shape))
        for e in bucket.entries
    ]


def bucket_pieces(bucket: Bucket, chunk_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges [start, end) of the broadcasts of one bucket, in order, covering it.

    0: the whole bucket in one broadcast (what SGLang's flattened_bucket receiver expects).
    Otherwise consecutive tensors are grouped into pieces of at most `chunk_bytes`, and a tensor
    larger than that gets pieces of its own (`chunk_bytes` each, the last shorter), which a sender
    can broadcast straight from the tensor's memory without packing it first."""
    if not chunk_bytes:
        return [(0, bucket.num_bytes)] if bucket.num_bytes else []
    pieces: list[tuple[int, int]] = []
    start = end = 0
    for entry in bucket.entries:
        entry_end = entry.offset + entry.num_bytes
        if entry.num_bytes > chunk_bytes or entry_end - start > chunk_bytes:
            pieces.append((start, end))  # close the group of small tensors before this one
            start = end = entry.offset
        if entry.num_bytes > chunk_bytes:
            pieces += [
                (a, min(a + chunk_bytes, entry_end)) for a in range(entry.offset, entry_end, chunk_bytes)
            ]
            start = end = entry_end
        else:
            end = entry_end
    pieces.append((start, end))
    return [(a, b) for a, b in pieces if b > a]


def check_chunk_bytes(chunk_bytes: int) -> str:
    """ "" if `chunk_bytes` is usable (0, or a positive multiple of 4096), else the problem."""
    if chunk_bytes < 0 or chunk_bytes % 4096:
        return f"must be 0 or a positive multiple of 4096 (got {chunk_bytes})"
    return ""


def to_manifest(
    buckets: list[Bucket],
    weight_version: int,
    transport: str,
    disk_path: str = "",
    broadcast_chunk_bytes: int = 0,
) -> common_pb2.WeightManifest:
    """The WeightManifest of a planned (and checksummed) update."""
    return common_pb2.WeightManifest(
        weight_version=weight_version,
        checksum_algorithm=ALGORITHM,
        transport=transport,
        disk_path=disk_path,
        broadcast_chunk_bytes=broadcast_chunk_bytes,
        buckets=[
            common_pb2.WeightBucket(
                index=b.index,
                num_bytes=b.num_bytes,
                checksum=b.checksum,
                tensors=[
                    common_pb2.TensorSpec(
                        name=e.name, dtype=e.dtype, shape=e.shape, offset=e.offset, num_bytes=e.num_bytes
                    )
                    for e in b.entries
                ],
            )
            for b in buckets
        ],
    )


def _entry(spec: common_pb2.TensorSpec, where: str) -> TensorEntry:
    if not spec.name:
        raise ManifestError(f"{where}.name", "must not be empty")
    try:
        dtype = dtype_from_name(spec.dtype)
    except ValueError:
        raise ManifestError(f"{where}.dtype", f"unknown dtype {spec.dtype!r}") from None
    if spec.dtype == "auto" or any(d < 0 for d in spec.shape):
        raise ManifestError(
            f"{where}", f"needs a concrete dtype and shape (got {spec.dtype}, {list(spec.shape)})"
        )
    expected = tensor_num_bytes(dtype, tuple(spec.shape))
    if spec.num_bytes != expected:
        raise ManifestError(
            f"{where}.num_bytes", f"{spec.num_bytes} != {expected} for {spec.dtype} {list(spec.shape)}"
        )
    return TensorEntry(spec.name, dtype_name(dtype), tuple(spec.shape), spec.offset, spec.num_bytes)


def manifest_layout(manifest: common_pb2.WeightManifest) -> list[Bucket]:
    """The buckets of `manifest`, checked for consistency; ManifestError names the first bad field."""
    if manifest.weight_version <= 0:
        raise ManifestError("manifest.weight_version", f"must be positive (got {manifest.weight_version})")
    if manifest.transport not in TRANSPORTS:
        raise ManifestError(
            "manifest.transport", f"must be one of {', '.join(TRANSPORTS)} (got {manifest.transport!r})"
        )
    if manifest.checksum_algorithm != ALGORITHM:
        raise ManifestError(
            "manifest.checksum_algorithm",
            f"{manifest.checksum_algorithm!r} is not supported (expected {ALGORITHM})",
        )
    if not manifest.buckets:
        raise ManifestError("manifest.buckets", "must not be empty")
    problem = check_chunk_bytes(manifest.broadcast_chunk_bytes)
    if problem:
        raise ManifestError("manifest.broadcast_chunk_bytes", problem)
    buckets, names = [], set()
    for i, pb in enumerate(manifest.buckets):
        where = f"manifest.buckets[{i}]"
        if pb.index != i:
            raise ManifestError(f"{where}.index", f"buckets must be numbered in order (got {pb.index})")
        if not pb.checksum:
            raise ManifestError(f"{where}.checksum", "must not be empty")
        entries, offset = [], 0
        for k, spec in enumerate(pb.tensors):
            entry = _entry(spec, f"{where}.tensors[{k}]")
            if entry.offset != offset:
                raise ManifestError(
                    f"{where}.tensors[{k}].offset",
                    f"expected {offset} (tensors are packed), got {entry.offset}",
                )
            if entry.name in names:
                raise ManifestError(f"{where}.tensors[{k}].name", f"{entry.name!r} appears twice")
            names.add(entry.name)
            entries.append(entry)
            offset += entry.num_bytes
        if not entries or pb.num_bytes != offset:
            raise ManifestError(f"{where}.num_bytes", f"{pb.num_bytes} != {offset}, the sum of its tensors")
        buckets.append(Bucket(i, pb.num_bytes, entries, pb.checksum))
    return buckets


def bucket_file_name(index: int, num_buckets: int) -> str:
    """File of bucket `index` in a disk update (the Hugging Face sharded naming)."""
    return f"model-{index + 1:05d}-of-{num_buckets:05d}.safetensors"
