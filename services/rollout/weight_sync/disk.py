"""The disk transport's receive side: read the safetensors files trainer rank 0 wrote, one per bucket.

The files are read into host memory and every bucket's checksum is checked before receiver.py
swaps anything in; the trainer renames the directory into place only once it is complete, so a
reader never sees a partial version.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors import safe_open

from rollway.common.errors import FailedPrecondition
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.bucket_checksum import BucketChecksum, as_bytes
from rollway.common.weight_sync.buckets import Bucket, bucket_file_name
from rollway.rollout.weight_sync.base import Received, Receiver, ReceiveResult


class DiskReceiver(Receiver):
    """Read and verify the update's files (nothing to take part in when it is not applied)."""

    def receive(self, manifest: common_pb2.WeightManifest, buckets: list[Bucket], apply: bool) -> Received:
        if not apply:
            return Received()
        try:
            named, result = read_disk_buckets(manifest.disk_path, buckets)
        except (OSError, ValueError) as exc:
            raise FailedPrecondition(f"manifest.disk_path: {exc}") from None
        return Received(named, result)


def read_disk_buckets(
    directory: str, buckets: list[Bucket], keep: bool = True
) -> tuple[list[tuple[str, torch.Tensor]], ReceiveResult]:
    """Read the safetensors files of a disk update and verify each bucket's checksum.

    Raises FileNotFoundError / ValueError naming the file or tensor that does not match."""
    result = ReceiveResult(bad_buckets=[])
    tensors: list[tuple[str, torch.Tensor]] = []
    for bucket in buckets:
        path = Path(directory, bucket_file_name(bucket.index, len(buckets)))
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (bucket {bucket.index} of the manifest)")
        tick = time.perf_counter()
        with safe_open(str(path), framework="pt", device="cpu") as f:
            available = set(f.keys())
            loaded = []
            for entry in bucket.entries:
                if entry.name not in available:
                    raise ValueError(f"{path}: has no tensor {entry.name!r}")
                tensor = f.get_tensor(entry.name)
                if tensor.dtype != entry.torch_dtype or tuple(tensor.shape) != entry.shape:
                    raise ValueError(f"{path}: {entry.name} is {tensor.dtype} {tuple(tensor.shape)}, the manifest says "
                                     f"{entry.dtype} {entry.shape}")  # fmt: skip
                loaded.append((entry.name, tensor.contiguous()))
        result.wire_seconds += time.perf_counter() - tick
        tick = time.perf_counter()
        accumulator = BucketChecksum()
        for _, tensor in loaded:
            accumulator.update(as_bytes(tensor))
        if accumulator.hexdigest() != bucket.checksum:
            result.bad_buckets.append(bucket.index)
        result.verify_seconds += time.perf_counter() - tick
        if keep:
            tensors += loaded
    return tensors, result
