"""The interface of one weight transport's receive side, and what every transport shares.

A Receiver fills the staged tensors of one update (receiver.py then verifies, acknowledges and
swaps them in). It is made for the update with what its transport may use, the run's weight
group and staging pool; `receive` gets the manifest's layout and whether the update will be
applied (a refused or already-applied update still takes part in a broadcast, or the sender
would hang), and returns the tensors by name with the per-bucket checksum outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
import torch

from rollway.common.errors import RollwayError
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.buckets import Bucket
from rollway.common.weight_sync.group import WeightGroup
from rollway.rollout.weight_sync.staging import StagingPool


class WeightsCorrupt(RollwayError):
    """A received bucket does not match its checksum (the update is not committed)."""

    code = grpc.StatusCode.DATA_LOSS


class TransferFailed(Exception):
    """The bytes did not all arrive (a peer died, the group timed out): the group is broken."""


@dataclass
class ReceiveResult:
    """Per-phase seconds and the indices of buckets whose checksum did not match."""

    wire_seconds: float = 0.0
    verify_seconds: float = 0.0
    bad_buckets: list[int] | None = None


@dataclass
class Received:
    """One transport's delivery: the tensors by manifest name (empty when not applied), the
    checksum outcome, and the staging set that backs them (None: not from the staging pool)."""

    named: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    result: ReceiveResult = field(default_factory=lambda: ReceiveResult(bad_buckets=[]))
    pool_index: int | None = None


class Receiver:
    """One transport's receive side for engines that load weights in this process."""

    acknowledges = False  # can answer the sender's acknowledgement collective (needs the group)

    def __init__(self, group: WeightGroup | None, pool: StagingPool):
        self.group = group  # the run's weight group (None before InitWeightGroup)
        self.pool = pool  # the run's staging buffers

    def receive(self, manifest: common_pb2.WeightManifest, buckets: list[Bucket], apply: bool) -> Received:
        """The update's tensors, verified against the manifest's checksums; `apply` False: take
        part in the transfer only (the result is dropped). Raises a RollwayError on failure, or
        TransferFailed when the group broke mid-transfer."""
        raise NotImplementedError


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
