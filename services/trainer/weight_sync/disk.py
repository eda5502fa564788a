"""The disk transport's send side: one safetensors file per bucket, written by trainer rank 0.

    write:  every rank gathers each bucket (by byte ranges, gather.py, where the placements
            allow; otherwise tensor by tensor, base.gathered_tensors); rank 0 adds it up into the
            bucket's checksum and writes model-0000i-of-0000n.safetensors; then
            model.safetensors.index.json and config.json, so the directory loads like a sharded
            Hugging Face checkpoint (SGLang's update_weights_from_disk)
    send:   write into a temporary directory under disk_path, fsync, rename it into place
            atomically as weights-v<version> -> the manifest names it

Receivers read the directory after the manifest; the previous version stays for a receiver still
reading it, older ones are deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from rollway.common.errors import InvalidArgument, Unavailable
from rollway.common.manifest import fsync_tree
from rollway.common.weight_sync.bucket_checksum import BucketChecksum, as_bytes
from rollway.common.weight_sync.buckets import Bucket, bucket_file_name, to_manifest
from rollway.trainer.v1 import trainer_pb2
from rollway.trainer.weight_sync import gather as weight_gather
from rollway.trainer.weight_sync.base import OnRanks, Sender, SendResult, gathered_tensors

DISK_PREFIX = "weights-v"


class DiskSender(Sender):
    """Write the version's files, rename them into place, then the manifest names the directory."""

    transport = "disk"

    @staticmethod
    def check(request: trainer_pb2.PushWeightsRequest) -> None:
        if not request.disk_path:
            raise InvalidArgument("disk_path", "is required for the disk transport")

    def send(self, on_ranks: OnRanks, request):
        version = request.weight_version
        sent, directory = _write(on_ranks, request.disk_path, version)
        yield trainer_pb2.PushWeightsResponse(
            manifest=to_manifest(sent.buckets, version, self.transport, str(directory))
        )
        return SendResult(), sent


@dataclass(frozen=True)
class WriteFiles:
    """The write step of a push on every trainer rank (write_pass): the directory rank 0 writes into."""

    directory: str


def _write(on_ranks: OnRanks, disk_path: str, version: int):
    """Write into a temporary directory, fsync, rename into place atomically."""
    root = Path(disk_path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{DISK_PREFIX}{version:08d}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
    except OSError as exc:
        raise InvalidArgument("disk_path", f"cannot write under {root}: {exc}") from None
    sent = on_ranks(WriteFiles(str(tmp)))
    if sent.error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise Unavailable(f"weight version {version} was not written: {sent.error}")
    fsync_tree(tmp)
    final = root / f"{DISK_PREFIX}{version:08d}"
    if final.exists():  # a retry of the same version: replace the earlier copy
        shutil.rmtree(final)
    os.replace(tmp, final)
    _remove_old_versions(root, keep_from=version - 1)
    return sent, final


def _remove_old_versions(root: Path, keep_from: int) -> None:
    """Delete versions older than `keep_from` (the previous one stays for a receiver still reading it)."""
    for path in root.glob(f"{DISK_PREFIX}*"):
        suffix = path.name.removeprefix(DISK_PREFIX)
        if suffix.isdigit() and int(suffix) < keep_from:
            shutil.rmtree(path, ignore_errors=True)


def write_pass(
    model: torch.nn.Module, buckets: list[Bucket], rank: int, directory: str, hf_config
) -> SendResult | None:
    """Gather and write one safetensors file per bucket into `directory` (rank 0), with checksums.

    A write error (disk full, permissions) is reported in the result, never raised: the other
    ranks are still gathering."""
    result = SendResult(buckets=buckets, num_bytes=sum(b.num_bytes for b in buckets))
    started = time.perf_counter()
    if weight_gather.possible(model, buckets):
        bucket_tensors = _ranged_buckets(model, buckets, rank)
    else:
        bucket_tensors = _buckets_by_tensor(model, buckets, rank)
    for bucket, tensors in bucket_tensors:  # rank 0 only
        if result.error:
            continue
        accumulator = BucketChecksum()
        for entry in bucket.entries:
            accumulator.update(as_bytes(tensors[entry.name]))
        bucket.checksum = accumulator.hexdigest()
        tick = time.perf_counter()
        path = Path(directory, bucket_file_name(bucket.index, len(buckets)))
        try:
            save_file(tensors, str(path), {"format": "pt"})
        except OSError as exc:
            result.error = f"cannot write {path}: {exc}"
        result.wire_seconds += time.perf_counter() - tick
    if rank != 0:
        return None
    if not result.error:
        try:
            _write_index(Path(directory), buckets)
            hf_config.save_pretrained(directory)
        except OSError as exc:
            result.error = f"cannot write {directory}: {exc}"
    result.gather_seconds = time.perf_counter() - started - result.wire_seconds
    return result


def _buckets_by_tensor(model, buckets: list[Bucket], rank: int) -> Iterator[tuple[Bucket, dict]]:
    """(bucket, {name: full tensor on the host}) for each bucket, on rank 0; every rank gathers
    tensor by tensor (full_tensor) and only rank 0 yields."""
    tensors: dict[str, torch.Tensor] = {}
    for bucket, entry, full in gathered_tensors(model, buckets, keep=rank == 0):
        if full is None:
            continue
        tensors[entry.name] = full.cpu()
        if entry is bucket.entries[-1]:
            yield bucket, tensors
            tensors = {}


def _ranged_buckets(model, buckets: list[Bucket], rank: int) -> Iterator[tuple[Bucket, dict]]:
    """The same, gathered bucket by bucket by byte ranges (gather.py)."""
    ranges = weight_gather.RangeGather(model, buckets, rank)
    if rank != 0:
        for bucket in buckets:
            ranges.send(bucket)
        return
    device = next(iter(model.parameters())).device
    for bucket in buckets:
        buffer = torch.empty(bucket.padded_size, dtype=torch.uint8, device=device)
        ranges.gather_into(bucket, buffer)
        host = buffer.cpu()
        # A copy per tensor: offsets need not be aligned to the element size, and safetensors
        # refuses tensors that share memory.
        yield (
            bucket,
            {
                e.name: host[e.offset : e.offset + e.num_bytes].clone().view(e.torch_dtype).reshape(e.shape)
                for e in bucket.entries
            },
        )


def _write_index(directory: Path, buckets: list[Bucket]) -> None:
    """model.safetensors.index.json, so the directory loads like a sharded HF checkpoint."""
    weight_map = {e.name: bucket_file_name(b.index, len(buckets)) for b in buckets for e in b.entries}
    index = {"metadata": {"total_size": sum(b.num_bytes for b in buckets)}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
