"""A model directory as a disk weight update (gateway/sampler_weights.py), read back by
the rollout service's own disk receiver: every bucket verifies and holds the model's tensors."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from rollway.common.weight_sync.buckets import manifest_layout
from rollway.gateway.sampler_weights import prepare_update
from rollway.rollout.weight_sync.disk import read_disk_buckets


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_export_reads_back_verified_in_the_serving_dtype(tiny_model_dir, tmp_path, dtype):
    manifest = prepare_update(tiny_model_dir, dtype, tmp_path / "update")
    manifest.weight_version = 1  # what the loader sets
    buckets = manifest_layout(manifest)
    named, result = read_disk_buckets(manifest.disk_path, buckets)
    assert result.bad_buckets == []
    source = load_file(str(tiny_model_dir / "model.safetensors"))
    assert sorted(name for name, _ in named) == sorted(source)
    for name, tensor in named:
        assert tensor.dtype == getattr(torch, dtype)
        torch.testing.assert_close(tensor, source[name].to(tensor.dtype), atol=0, rtol=0)
    linked = (tmp_path / "update" / "model-00001-of-00001.safetensors").stat()
    same_file = linked.st_ino == os.stat(tiny_model_dir / "model.safetensors").st_ino
    assert same_file == (
        source[named[0][0]].dtype == getattr(torch, dtype)
    )  # linked, not copied, when no cast
