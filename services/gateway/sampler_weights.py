"""A Hugging Face model directory (a save_weights_for_sampler export, or a base model) as a
disk-transport weight update, so that a running rollout service loads it with UpdateWeights
instead of a new process starting on it.

    hf_dir/model*.safetensors  ->  update_dir/model-0000i-of-0000n.safetensors  (one bucket per file)
                                   + the manifest: tensors in file order, each bucket's checksum

A file already in the serving dtype is hard-linked (no copy; copied where the link fails), another
is cast and written; the rollout service reads, verifies and swaps the tensors in (its
weight_sync/disk.py), as it does for a trainer's disk push.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rollway.common.v1 import common_pb2


def weight_files(hf_dir: Path) -> list[Path]:
    """The safetensors files of a model directory, in the index's order (one file when unsharded)."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [hf_dir / name for name in names]
    single = hf_dir / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{hf_dir}: holds no model.safetensors (nor a sharded index)")
    return [single]


def prepare_update(hf_dir: Path, dtype: str, update_dir: Path) -> common_pb2.WeightManifest:
    """Write `update_dir` (replaced) and return its manifest, weight_version 0 (the loader sets
    the version it commits)."""
    # torch only here: the gateway loads it when it first loads weights into a rollout service.
    from safetensors import safe_open
    from safetensors.torch import save_file

    from rollway.common.weight_sync.bucket_checksum import BucketChecksum, as_bytes
    from rollway.common.weight_sync.buckets import (
        Bucket,
        TensorEntry,
        bucket_file_name,
        dtype_name,
        to_manifest,
    )
    from rollway.common.weights_checksum import dtype_from_name

    serving = dtype_from_name(dtype)
    shutil.rmtree(update_dir, ignore_errors=True)
    update_dir.mkdir(parents=True)
    files = weight_files(hf_dir)
    buckets = []
    for index, path in enumerate(files):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            tensors = {name: f.get_tensor(name) for name in sorted(f.keys())}
        cast = any(t.dtype != serving for t in tensors.values())
        if cast:
            tensors = {name: t.to(serving).contiguous() for name, t in tensors.items()}
        target = update_dir / bucket_file_name(index, len(files))
        if cast:
            save_file(tensors, str(target), metadata={"format": "pt"})
        else:
            try:
                os.link(path, target)
            except OSError:  # another filesystem
                shutil.copyfile(path, target)
        entries, offset, checksum = [], 0, BucketChecksum()
        for name, tensor in tensors.items():
            num_bytes = tensor.numel() * tensor.element_size()
            entries.append(
                TensorEntry(name, dtype_name(tensor.dtype), tuple(tensor.shape), offset, num_bytes)
            )
            checksum.update(as_bytes(tensor.contiguous()))
            offset += num_bytes
        buckets.append(Bucket(index, offset, entries, checksum.hexdigest()))
    return to_manifest(buckets, 0, "disk", str(update_dir))
