"""The shared weights checksum (rollway.common.weights_checksum): order, dtype and content."""

import hashlib

import pytest
import torch

from rollway.common.weights_checksum import dtype_from_name, weights_checksum


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return {"b.weight": torch.randn(3, 4, generator=gen), "a.bias": torch.randn(5, generator=gen)}


def test_digest_follows_the_documented_byte_stream():
    tensors = _tensors()
    expected = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].to(torch.bfloat16)
        expected.update(f"{name}\0bfloat16\0{','.join(map(str, t.shape))}\0".encode())
        expected.update(t.view(torch.uint8).numpy().tobytes())
    assert weights_checksum(tensors.items(), torch.bfloat16) == (expected.hexdigest(), 2)


def test_digest_ignores_input_order_but_not_values_names_or_dtype():
    tensors = _tensors()
    digest, count = weights_checksum(tensors.items(), torch.float32)
    assert weights_checksum(reversed(list(tensors.items())), torch.float32) == (digest, count)
    changed = dict(tensors, **{"a.bias": tensors["a.bias"] + 1e-6})
    assert weights_checksum(changed.items(), torch.float32)[0] != digest
    renamed = {"c.bias" if k == "a.bias" else k: v for k, v in tensors.items()}
    assert weights_checksum(renamed.items(), torch.float32)[0] != digest
    assert weights_checksum(tensors.items(), torch.bfloat16)[0] != digest
    reshaped = dict(tensors, **{"b.weight": tensors["b.weight"].reshape(4, 3)})
    assert weights_checksum(reshaped.items(), torch.float32)[0] != digest


def test_non_contiguous_tensors_hash_like_their_contiguous_copy():
    t = torch.arange(12.0).reshape(3, 4)
    assert weights_checksum([("w", t.t())], torch.float32) == weights_checksum(
        [("w", t.t().contiguous())], torch.float32
    )


def test_duplicate_names_and_unknown_dtypes_are_errors():
    with pytest.raises(ValueError, match="appears twice"):
        weights_checksum([("w", torch.zeros(1)), ("w", torch.zeros(1))], torch.float32)
    assert dtype_from_name("torch.bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_from_name("float33")
