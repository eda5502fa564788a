"""The disk path of a weight update: one safetensors file per bucket, written by trainer rank 0.

    every rank gathers each full tensor in bucket order (weight_send.gathered_tensors); rank 0 casts it,
    adds it to its bucket's checksum and, at the end of a bucket, writes
    model-0000i-of-0000n.safetensors; then model.safetensors.index.json and config.json, so the
    directory loads like a sharded Hugging Face checkpoint (SGLang's update_weights_from_disk).

The directory is temporary until WeightPusher renames it into place (after an fsync).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from rollway.common.bucket_checksum import BucketChecksum, as_bytes
from rollway.common.weight_buckets import Bucket, bucket_file_name
from rollway.trainer.weight_send import SendResult, gathered_tensors


def write_pass(
    model: torch.nn.Module, buckets: list[Bucket], rank: int, directory: str, hf_config
) -> SendResult | None:
    """Gather and write one safetensors file per bucket into `directory` (rank 0), with checksums.

    A write error (disk full, permissions) is reported in the result, never raised: the other
    ranks are still gathering."""
    result = SendResult(buckets=buckets, num_bytes=sum(b.num_bytes for b in buckets))
    tensors: dict[str, torch.Tensor] = {}
    accumulator = BucketChecksum()
    started = time.perf_counter()
    for bucket, entry, full in gathered_tensors(model, buckets, keep=rank == 0):
        if full is None or result.error:
            continue
        tensors[entry.name] = full = full.cpu()
        accumulator.update(as_bytes(full))
        if entry is bucket.entries[-1]:
            bucket.checksum = accumulator.hexdigest()
            tick = time.perf_counter()
            path = Path(directory, bucket_file_name(bucket.index, len(buckets)))
            try:
                save_file(tensors, str(path), {"format": "pt"})
            except OSError as exc:
                result.error = f"cannot write {path}: {exc}"
            result.wire_seconds += time.perf_counter() - tick
            tensors, accumulator = {}, BucketChecksum()
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


def _write_index(directory: Path, buckets: list[Bucket]) -> None:
    """model.safetensors.index.json, so the directory loads like a sharded HF checkpoint."""
    weight_map = {e.name: bucket_file_name(b.index, len(buckets)) for b in buckets for e in b.entries}
    index = {"metadata": {"total_size": sum(b.num_bytes for b in buckets)}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
