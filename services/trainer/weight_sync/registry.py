"""The transport a PushWeights request names -> its Sender, and the passes the trainer ranks run.

Adding a transport is a new module beside distributed.py and disk.py (and its twin on the
rollout side) plus one line here.
"""

from __future__ import annotations

import torch

from rollway.common.errors import InvalidArgument
from rollway.common.weights_checksum import dtype_from_name
from rollway.trainer.weight_sync.base import Sender, SendResult, checksum_pass, plan_layout
from rollway.trainer.weight_sync.disk import DiskSender
from rollway.trainer.weight_sync.distributed import DistributedSender

SENDERS: dict[str, Sender] = {
    "distributed": DistributedSender(),
    "disk": DiskSender(),
}


def sender_for(transport: str) -> Sender:
    """The Sender of `transport`; InvalidArgument if none is registered."""
    sender = SENDERS.get(transport)
    if sender is None:
        raise InvalidArgument("transport", f"must be one of {', '.join(SENDERS)} (got {transport!r})")
    return sender


def run_phase(engine, phase: str, dtype: str, bucket_size_bytes: int, **kwargs) -> SendResult | None:
    """One pass of a weight update on this rank: "plan" (the checksums every transport's manifest
    carries) or a transport's own pass (Sender.phase: "broadcast", "write")."""
    buckets = plan_layout(engine.model, dtype_from_name(dtype), bucket_size_bytes)
    with torch.no_grad():
        if phase == "plan":
            return checksum_pass(engine.model, buckets, engine.info.rank)
        for sender in SENDERS.values():
            if sender.phase == phase:
                return sender.run_pass(engine, buckets, **kwargs)
    raise ValueError(f"unknown weight push phase {phase!r}")
