"""Bucket layout, manifests and the blocksum64 checksum shared by the weight sender and receivers."""

from __future__ import annotations

import pytest
import torch

from rollway.common.weight_sync.bucket_checksum import (
    BLOCK_WORDS,
    BucketChecksum,
    as_bytes,
    bucket_checksum,
    format_digest,
    partial_sums,
)
from rollway.common.weight_sync.buckets import (
    ManifestError,
    TensorEntry,
    bucket_pieces,
    bucket_views,
    manifest_layout,
    plan_buckets,
    to_manifest,
)

MASK = (1 << 64) - 1


def _reference(data: bytes) -> str:
    """The documented formula, word by word in plain Python."""
    data = data + b"\0" * (-len(data) % 8)
    s1 = s2 = 0
    for i in range(len(data) // 8):
        word = int.from_bytes(data[8 * i : 8 * i + 8], "little")
        s1 = (s1 + word) & MASK
        s2 = (s2 + (i // BLOCK_WORDS + 1) * word) & MASK
    return f"{s1:016x}{s2:016x}"


def test_checksum_follows_the_documented_formula():
    gen = torch.Generator().manual_seed(0)
    for size in (1, 7, 8, 4095, 4096, 4097, 3 * 4096 + 13):
        data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
        assert bucket_checksum(data) == _reference(bytes(data.tolist())), size


def test_pieces_of_any_size_and_alignment_give_the_flat_checksum():
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (5 * 4096 + 3,), dtype=torch.uint8, generator=gen)
    expected = bucket_checksum(data)
    for cuts in ([3, 4096, 10000], [1, 2, 3, 5, 8, 13, 8192 + 5], [4093, 4100, 4101]):
        acc = BucketChecksum()
        for start, end in zip([0, *cuts], [*cuts, data.numel()], strict=True):
            acc.update(data[start:end])
        assert acc.hexdigest() == expected, cuts
        assert acc.num_bytes == data.numel()


def test_pieces_summed_in_any_order_give_the_flat_checksum():
    """What lets trainer ranks checksum their own shards and add the sums with an all-reduce."""
    data = torch.randint(
        0, 256, (3 * 4096 + 5,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)
    )
    cuts = [0, 3, 11, 4099, 4100, 8200, data.numel()]
    pieces = [partial_sums(data[a:b].clone(), a) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    s1 = sum(p[0] for p in reversed(pieces))
    s2 = sum(p[1] for p in reversed(pieces))
    assert format_digest(s1, s2) == bucket_checksum(data)


def test_every_single_bit_flip_and_a_block_swap_are_detected():
    data = torch.randint(0, 256, (3 * 4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    expected = bucket_checksum(data)
    for pos in (0, 7, 4096, 3 * 4096 - 1):
        for bit in (0, 7):
            flipped = data.clone()
            flipped[pos] ^= 1 << bit
            assert bucket_checksum(flipped) != expected, (pos, bit)
    swapped = torch.cat([data[4096:8192], data[:4096], data[8192:]])
    assert bucket_checksum(swapped) != expected
    assert bucket_checksum(torch.zeros_like(data)) != expected


def _specs():
    return [
        TensorEntry("a", "float32", (4, 8)),  # 128 bytes
        TensorEntry("b", "float32", (3,)),  # 12 bytes
        TensorEntry("c", "float32", (64,)),  # 256 bytes: does not fit after a+b in 256
        TensorEntry("d", "float32", (100,)),  # 400 bytes: larger than a bucket, travels alone
    ]


def test_tensors_are_packed_in_order_and_an_oversized_one_travels_alone():
    buckets = plan_buckets(_specs(), bucket_size_bytes=256)
    assert [[e.name for e in b.entries] for b in buckets] == [["a", "b"], ["c"], ["d"]]
    assert [(e.offset, e.num_bytes) for e in buckets[0].entries] == [(0, 128), (128, 12)]
    assert [b.num_bytes for b in buckets] == [140, 256, 400]
    assert buckets[0].padded_size == 144


def test_views_are_the_tensors_packed_into_a_flat_buffer():
    buckets = plan_buckets(_specs(), bucket_size_bytes=1 << 20)
    tensors = {e.name: torch.randn(e.shape) for e in buckets[0].entries}
    flat = torch.cat([as_bytes(tensors[e.name]) for e in buckets[0].entries])
    views = dict(bucket_views(flat, buckets[0]))
    assert all(torch.equal(views[name], tensors[name]) for name in tensors)
    acc = BucketChecksum()
    for e in buckets[0].entries:
        acc.update(as_bytes(tensors[e.name]))
    assert acc.hexdigest() == bucket_checksum(flat)


def test_manifest_round_trip_and_refusals_name_the_field():
    buckets = plan_buckets(_specs(), bucket_size_bytes=256)
    for b in buckets:
        b.checksum = "00" * 16
    manifest = to_manifest(buckets, weight_version=3, transport="distributed")
    again = manifest_layout(manifest)
    assert [(b.num_bytes, b.entries) for b in again] == [(b.num_bytes, b.entries) for b in buckets]

    def refused(mutate) -> str:
        bad = type(manifest)()
        bad.CopyFrom(manifest)
        mutate(bad)
        with pytest.raises(ManifestError) as info:
            manifest_layout(bad)
        return info.value.field

    assert refused(lambda m: setattr(m, "weight_version", 0)) == "manifest.weight_version"
    assert refused(lambda m: setattr(m, "transport", "carrier-pigeon")) == "manifest.transport"
    assert refused(lambda m: setattr(m, "checksum_algorithm", "md5")) == "manifest.checksum_algorithm"
    assert refused(lambda m: setattr(m.buckets[1], "num_bytes", 7)) == "manifest.buckets[1].num_bytes"
    assert (
        refused(lambda m: setattr(m.buckets[0].tensors[1], "offset", 64))
        == "manifest.buckets[0].tensors[1].offset"
    )
    assert (
        refused(lambda m: setattr(m.buckets[0].tensors[0], "dtype", "float99"))
        == "manifest.buckets[0].tensors[0].dtype"
    )
    assert (
        refused(lambda m: m.buckets[2].tensors[0].shape.append(2))
        == "manifest.buckets[2].tensors[0].num_bytes"
    )
    assert (
        refused(lambda m: setattr(m.buckets[1].tensors[0], "name", "a"))
        == "manifest.buckets[1].tensors[0].name"
    )
    assert refused(lambda m: setattr(m.buckets[0], "checksum", "")) == "manifest.buckets[0].checksum"


def test_pieces_cover_the_bucket_group_small_tensors_and_split_large_ones_alone():
    specs = [TensorEntry("a", "float32", (10,)), TensorEntry("b", "float32", (10,)),  # 40 + 40
             TensorEntry("big", "float32", (100,)), TensorEntry("c", "float32", (5,)),  # 400, 20
             TensorEntry("empty", "float32", (0,)), TensorEntry("d", "float32", (30,))]  # 0, 120  # fmt: skip
    bucket = plan_buckets(specs, 1 << 20)[0]
    assert bucket_pieces(bucket, 0) == [(0, 620)]
    assert bucket_pieces(bucket, 1024) == [(0, 620)]
    assert bucket_pieces(bucket, 128) == [
        (0, 80),
        (80, 208),
        (208, 336),
        (336, 464),
        (464, 480),
        (480, 500),
        (500, 620),
    ]
    for chunk in (8, 64, 96, 400, 4096):
        pieces = bucket_pieces(bucket, chunk)
        assert pieces[0][0] == 0 and pieces[-1][1] == 620
        assert all(end == start for (_, end), (start, _) in zip(pieces[:-1], pieces[1:], strict=True))
        assert all(0 < end - start <= chunk for start, end in pieces)
        if chunk <= 400:  # the large tensor's pieces are its own
            big = [p for p in pieces if 80 <= p[0] < 480]
            assert big[0][0] == 80 and big[-1][1] == 480
