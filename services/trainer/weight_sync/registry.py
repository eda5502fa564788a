"""The transport a PushWeights request names -> its Sender, and the two commands every rank runs
(PlanWeights, SendWeights: trainer/commands.py).

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


def plan_weights(engine, dtype: str, bucket_size_bytes: int) -> SendResult | None:
    """PlanWeights on one rank: the buckets and the checksums every transport's manifest carries."""
    with torch.no_grad():
        buckets = plan_layout(engine.model, dtype_from_name(dtype), bucket_size_bytes)
        return checksum_pass(engine.model, buckets, engine.info.rank)


def send_weights(engine, transport: str, dtype: str, bucket_size_bytes: int, arguments) -> SendResult | None:
    """SendWeights on one rank: the transport's own pass over the same buckets."""
    with torch.no_grad():
        buckets = plan_layout(engine.model, dtype_from_name(dtype), bucket_size_bytes)
        return sender_for(transport).run_pass(engine, buckets, arguments)
