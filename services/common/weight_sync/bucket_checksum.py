"""The per-bucket checksum of a weight update: cheap enough to run on every byte that moves.

    acc = BucketChecksum()
    for tensor in bucket_tensors:          # in bucket order, each right after the previous one
        acc.update(tensor_bytes_uint8)
    digest = acc.hexdigest()               # equals bucket_checksum(flat bucket bytes)

Algorithm "blocksum64" (the WeightManifest.checksum_algorithm value). The bucket's bytes,
zero-padded to a multiple of 8, are read as little-endian 64-bit words w_0 .. w_{n-1}; with
b(i) = i // 512 (the 4 KiB block of word i):

    s1 = sum(w_i)              mod 2**64
    s2 = sum((b(i) + 1) * w_i) mod 2**64        digest = f"{s1:016x}{s2:016x}"

Why not sha256 (rollway.common.weights_checksum, used for whole-model comparisons): sha256 runs
at ~0.9 GB/s on one CPU core, about the speed of a loopback broadcast, so hashing every bucket
on both sides would halve the bandwidth of a weight update; and on GPUs it needs every byte
copied to the host. These sums are vectorised torch reductions (~10 GB/s on one CPU core,
device speed on GPU, no copies) and, being linear in the words, can be accumulated tensor by
tensor without first packing the bucket. Being linear in the bytes, they can also be summed from
pieces held by different processes: the trainer's ranks each checksum their own FSDP shard
(partial_sums at the shard's position) and add the results with one all-reduce. They detect any
change confined to one word (every bit flip), truncation, zero-fill and blocks in the wrong
place; they are not cryptographic and miss word swaps inside one block, which the transport's
own framing already rules out.
"""

from __future__ import annotations

import torch

ALGORITHM = "blocksum64"
BLOCK_WORDS = 512
WORD_BYTES = 8
MASK = (1 << 64) - 1


def _word_sums(words: torch.Tensor, start: int) -> tuple[int, int]:
    """(s1, s2) contributions of 1-D int64 `words` whose first word has index `start`."""
    n = words.numel()
    s1 = s2 = 0
    pos = min(n, (-start) % BLOCK_WORDS)  # words before the next block boundary
    if pos:
        head = int(words[:pos].sum())
        s1, s2 = head, head * (start // BLOCK_WORDS + 1)
    num_blocks = (n - pos) // BLOCK_WORDS
    if num_blocks:
        blocks = words[pos : pos + num_blocks * BLOCK_WORDS].view(num_blocks, BLOCK_WORDS).sum(1)
        first = (start + pos) // BLOCK_WORDS + 1
        weights = torch.arange(first, first + num_blocks, dtype=torch.int64, device=words.device)
        s1 += int(blocks.sum())
        s2 += int((blocks * weights).sum())  # int64 products wrap: congruent mod 2**64
        pos += num_blocks * BLOCK_WORDS
    if pos < n:
        tail = int(words[pos:].sum())
        s1 += tail
        s2 += tail * ((start + pos) // BLOCK_WORDS + 1)
    return s1, s2


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a 1-D uint8 view (no copy)."""
    if not tensor.is_contiguous():
        raise ValueError("as_bytes: the tensor must be contiguous")
    return tensor.reshape(-1).view(torch.uint8)


def _loose_bytes(data: torch.Tensor, byte_offset: int) -> tuple[int, int]:
    """Contribution of a few bytes that do not fill an aligned word: byte k of word i adds
    b * 256**k to w_i (little-endian words), so partial words add up like whole ones."""
    s1 = s2 = 0
    for i, byte in enumerate(data.cpu().tolist()):
        position = byte_offset + i
        value = byte << (8 * (position % WORD_BYTES))
        s1 += value
        s2 += value * (position // WORD_BYTES // BLOCK_WORDS + 1)
    return s1, s2


def partial_sums(data: torch.Tensor, byte_offset: int) -> tuple[int, int]:
    """(s1, s2) mod 2**64 contributed by `data` (1-D uint8) lying at `byte_offset` of a bucket.

    The checksum is linear in the bytes: pieces of a bucket summed anywhere (other processes,
    any order, any alignment) give the bucket's checksum. Whole aligned words are summed on the
    tensor's device; at most 14 loose bytes at the ends are added one by one."""
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError("partial_sums takes a 1-D uint8 tensor")
    n = data.numel()
    head = min(n, (-byte_offset) % WORD_BYTES)
    whole = (n - head) // WORD_BYTES * WORD_BYTES
    s1, s2 = _loose_bytes(data[:head], byte_offset)
    if whole:
        middle = data[head : head + whole]
        if middle.storage_offset() % WORD_BYTES:  # an int64 view needs word alignment
            middle = middle.clone()
        w1, w2 = _word_sums(middle.view(torch.int64), (byte_offset + head) // WORD_BYTES)
        s1, s2 = s1 + w1, s2 + w2
    t1, t2 = _loose_bytes(data[head + whole :], byte_offset + head + whole)
    return (s1 + t1) & MASK, (s2 + t2) & MASK


def format_digest(s1: int, s2: int) -> str:
    return f"{s1 & MASK:016x}{s2 & MASK:016x}"


class BucketChecksum:
    """Accumulates the blocksum64 of a byte stream fed in order, in pieces of any size."""

    def __init__(self) -> None:
        self.s1 = 0
        self.s2 = 0
        self.num_bytes = 0

    def update(self, data: torch.Tensor) -> None:
        """Add the next bytes (a 1-D uint8 tensor, on any device)."""
        s1, s2 = partial_sums(data, self.num_bytes)
        self.s1, self.s2 = (self.s1 + s1) & MASK, (self.s2 + s2) & MASK
        self.num_bytes += data.numel()

    def hexdigest(self) -> str:
        """The digest of everything fed so far (the last word zero-padded)."""
        return format_digest(self.s1, self.s2)


def bucket_checksum(data: torch.Tensor) -> str:
    """blocksum64 of a flat 1-D uint8 buffer."""
    acc = BucketChecksum()
    acc.update(data)
    return acc.hexdigest()
