"""The weights checksum: name order, dtype cast, every byte counts."""

from __future__ import annotations

import hashlib

import torch

from rollway.trainer.weights import tensor_bytes, weight_names, weights_checksum


def test_checksum_is_sha256_over_names_and_bytes_in_name_order():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])
    digest, count = weights_checksum(iter([("a", a), ("b", b)]))
    expected = hashlib.sha256(b"a\x00" + a.numpy().tobytes() + b"b\x00" + b.numpy().tobytes()).hexdigest()
    assert (digest, count) == (expected, 2)
    changed, _ = weights_checksum(iter([("a", a), ("b", torch.nextafter(b, b + 1))]))  # one ulp
    assert changed != digest


def test_bfloat16_bytes_are_two_per_value():
    assert len(tensor_bytes(torch.ones(3, dtype=torch.bfloat16))) == 6
    assert tensor_bytes(torch.ones(1, dtype=torch.bfloat16)) == b"\x80\x3f"


def test_weight_names_list_tied_weights_once_and_skip_non_persistent_buffers():
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(4, 2)
    model.head = torch.nn.Linear(2, 4, bias=False)
    model.head.weight = model.embed.weight
    model.register_buffer("inv_freq", torch.ones(1), persistent=False)
    model.register_buffer("scale", torch.ones(1))
    assert weight_names(model) == ["embed.weight", "scale"]
