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
tensor without first packing the bucket. They detect any change confined to one word (every bit
flip), truncation, zero-fill and blocks in the wrong place; they are not cryptographic and miss
word swaps inside one block, which the transport's own framing already rules out.
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


class BucketChecksum:
    """Accumulates the blocksum64 of a byte stream fed in order, in pieces of any size."""

    def __init__(self) -> None:
        self.s1 = 0
        self.s2 = 0
        self.num_bytes = 0
        self._num_words = 0  # complete words summed so far
        self._carry = b""  # bytes of the next word, not yet complete

    def update(self, data: torch.Tensor) -> None:
        """Add the next bytes (a 1-D uint8 tensor, on any device)."""
        if data.dtype != torch.uint8 or data.dim() != 1:
            raise ValueError("BucketChecksum.update takes a 1-D uint8 tensor")
        pos = 0
        if self._carry:
            pos = min(WORD_BYTES - len(self._carry), data.numel())
            self._carry += bytes(data[:pos].cpu().tolist())
            if len(self._carry) == WORD_BYTES:
                self._add_words(torch.frombuffer(bytearray(self._carry), dtype=torch.int64))
                self._carry = b""
        whole = (data.numel() - pos) // WORD_BYTES * WORD_BYTES
        if whole:
            middle = data[pos : pos + whole]
            if middle.storage_offset() % WORD_BYTES:  # an int64 view needs word alignment
                middle = middle.clone()
            self._add_words(middle.view(torch.int64))
            pos += whole
        if pos < data.numel():
            self._carry += bytes(data[pos:].cpu().tolist())
        self.num_bytes += data.numel()

    def _add_words(self, words: torch.Tensor) -> None:
        s1, s2 = _word_sums(words, self._num_words)
        self.s1 = (self.s1 + s1) & MASK
        self.s2 = (self.s2 + s2) & MASK
        self._num_words += words.numel()

    def hexdigest(self) -> str:
        """The digest of everything fed so far (the last word zero-padded)."""
        s1, s2 = self.s1, self.s2
        if self._carry:
            word = torch.frombuffer(bytearray(self._carry.ljust(WORD_BYTES, b"\0")), dtype=torch.int64)
            c1, c2 = _word_sums(word, self._num_words)
            s1, s2 = (s1 + c1) & MASK, (s2 + c2) & MASK
        return f"{s1:016x}{s2:016x}"


def bucket_checksum(data: torch.Tensor) -> str:
    """blocksum64 of a flat 1-D uint8 buffer."""
    acc = BucketChecksum()
    acc.update(data)
    return acc.hexdigest()
