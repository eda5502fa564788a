"""In-process receiving of a weight update: staging buffers, the receive loop, disk reads, checks.

    post recv(pieces 0..3) ─> wait(0) ─> post recv(4) ─> checksum(0) ─> wait(1) ─> post recv(5) ─> ...

A piece is a bucket (manifest.broadcast_chunk_bytes 0) or a consecutive part of one
(rollway.common.weight_buckets.bucket_pieces, the same function the sender uses).

Buckets land in staging buffers that the served model does not use, so the engine keeps serving
the old weights until every checksum matched. The pool holds two sets of buffers: after a
verified update the engine swaps its parameters onto views of the set just received (no copy),
and the other set receives the next update. Memory: two copies of the weights, as with a
separate staging copy.

Test hooks (environment variables, read on every update; tests set them on the service process):
    ROLLWAY_TEST_SLOW_RECEIVE_SECONDS  sleep this long before receiving each bucket (a slow
                                       receiver, so a test can kill it mid-transfer)
    ROLLWAY_TEST_CORRUPT_RECEIVE       "1": flip one byte of bucket 0 after it arrived (the
                                       checksum must catch it)
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch
from safetensors import safe_open

from rollway.common.bucket_checksum import BucketChecksum, as_bytes
from rollway.common.errors import RollwayError
from rollway.common.weight_buckets import Bucket, bucket_file_name, bucket_pieces
from rollway.common.weight_group import WeightGroup, WeightGroupError

SLOW_RECEIVE_ENV = "ROLLWAY_TEST_SLOW_RECEIVE_SECONDS"
CORRUPT_RECEIVE_ENV = "ROLLWAY_TEST_CORRUPT_RECEIVE"
PIECES_IN_FLIGHT = 4  # receives posted ahead, so the next pieces arrive while one is verified


class WeightsCorrupt(RollwayError):
    """A received bucket does not match its checksum (the update is not committed)."""

    code = grpc.StatusCode.DATA_LOSS


@dataclass
class ReceiveResult:
    """Per-phase seconds and the indices of buckets whose checksum did not match."""

    wire_seconds: float = 0.0
    verify_seconds: float = 0.0
    bad_buckets: list[int] | None = None


class StagingPool:
    """Two sets of bucket buffers; the `live` one may back the served weights after a swap."""

    def __init__(self) -> None:
        self._sets: list[list[torch.Tensor]] = []
        self.live: int | None = None

    def take(self, buckets: list[Bucket], device: torch.device) -> tuple[int, list[torch.Tensor]]:
        """A set of buffers for `buckets` (reused when the layout repeats) that the served model does not use."""
        sizes = [b.padded_size for b in buckets]
        for i, buffers in enumerate(self._sets):
            if i != self.live and [b.numel() for b in buffers] == sizes and buffers[0].device == device:
                return i, buffers
        spare = [i for i in range(len(self._sets)) if i != self.live]
        fresh = [torch.empty(size, dtype=torch.uint8, device=device) for size in sizes]
        if len(self._sets) < 2:
            self._sets.append(fresh)
            return len(self._sets) - 1, fresh
        self._sets[spare[0]] = []  # drop the old set before the new one counts
        self._sets[spare[0]] = fresh
        return spare[0], fresh

    def clear(self) -> None:
        """Free every buffer (ReleaseMemory: the engine's weights are gone as well)."""
        self._sets, self.live = [], None


def flip_byte_for_test(buffer: torch.Tensor, num_bytes: int) -> None:
    buffer[num_bytes // 2] ^= 0x10


def receive_buckets(
    group: WeightGroup, buckets: list[Bucket], buffers: list[torch.Tensor], verify: bool, chunk_bytes: int = 0
) -> ReceiveResult:
    """Receive every bucket from rank 0 into `buffers`, piece by piece (bucket_pieces; chunk_bytes
    0: whole buckets), keeping a few pieces in flight; each arrived piece is added to its
    bucket's checksum while the next ones arrive.

    Raises WeightGroupError (the group is then broken) if a transfer fails or times out."""
    slow = float(os.environ.get(SLOW_RECEIVE_ENV) or 0)
    corrupt = os.environ.get(CORRUPT_RECEIVE_ENV) == "1"
    pieces = [(b, start, end) for b in buckets for start, end in bucket_pieces(b, chunk_bytes)]
    result = ReceiveResult(bad_buckets=[])
    started = time.perf_counter()
    pending: deque = deque()
    checksum = BucketChecksum()
    next_index = 0

    def post_next() -> None:
        nonlocal next_index
        bucket, start, end = pieces[next_index]
        next_index += 1
        if slow:
            time.sleep(slow)
        pending.append((bucket, start, end, group.broadcast(buffers[bucket.index][start:end], src=0)))

    try:
        while next_index < min(PIECES_IN_FLIGHT, len(pieces)):
            post_next()
        while pending:
            bucket, start, end, work = pending.popleft()
            group.wait(work)  # in slices: leaving the group (a stopping service) ends the wait
            if next_index < len(pieces):
                post_next()
            if corrupt and bucket.index == 0 and start == 0:
                buffers[0][(start + end) // 2] ^= 0x10
            if verify:
                tick = time.perf_counter()
                checksum.update(buffers[bucket.index][start:end])
                if end == bucket.num_bytes:
                    if checksum.hexdigest() != bucket.checksum:
                        result.bad_buckets.append(bucket.index)
                    checksum = BucketChecksum()
                result.verify_seconds += time.perf_counter() - tick
    except RuntimeError as exc:
        group.mark_broken(str(exc))
        where = f"piece {next_index - len(pending)} of {len(pieces)}"
        raise WeightGroupError(f"{where}: {str(exc).splitlines()[0]}") from None
    result.wire_seconds = time.perf_counter() - started - result.verify_seconds
    return result


def read_disk_buckets(
    directory: str, buckets: list[Bucket], keep: bool = True
) -> tuple[list[tuple[str, torch.Tensor]], ReceiveResult]:
    """Read the safetensors files of a disk update and verify each bucket's checksum.

    Raises FileNotFoundError / ValueError naming the file or tensor that does not match."""
    result = ReceiveResult(bad_buckets=[])
    tensors: list[tuple[str, torch.Tensor]] = []
    corrupt = os.environ.get(CORRUPT_RECEIVE_ENV) == "1"
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
        if corrupt and bucket.index == 0:
            loaded[0] = (loaded[0][0], loaded[0][1].clone())
            flip_byte_for_test(as_bytes(loaded[0][1]), loaded[0][1].nbytes)
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


def check_against_model(buckets: list[Bucket], served: dict[str, torch.Tensor], required: set[str]) -> str:
    """ "" if every manifest tensor fits the served model and every `required` name is covered;
    else the first problem."""
    names = set()
    for bucket in buckets:
        for entry in bucket.entries:
            names.add(entry.name)
            target = served.get(entry.name)
            if target is None:
                return f"{entry.name!r} is not a parameter or buffer of the served model"
            if tuple(target.shape) != entry.shape or target.dtype != entry.torch_dtype:
                return (f"{entry.name} is {entry.dtype} {list(entry.shape)}, the served model has "
                        f"{str(target.dtype).removeprefix('torch.')} {list(target.shape)}")  # fmt: skip
    missing = sorted(required - names)
    if missing:
        return f"misses {len(missing)} parameter(s) of the served model, e.g. {missing[0]!r}"
    return ""
