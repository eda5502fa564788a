"""The transport a PushWeights request names -> the kind of Sender that serves it.

Adding a transport is a new module beside distributed.py and disk.py (its Sender and the step
its ranks run: passes.py), its twin on the rollout side, and one line here.
"""

from __future__ import annotations

from rollway.common.errors import InvalidArgument
from rollway.trainer.weight_sync.base import Sender
from rollway.trainer.weight_sync.disk import DiskSender
from rollway.trainer.weight_sync.distributed import DistributedSender

SENDERS: dict[str, type[Sender]] = {
    "distributed": DistributedSender,
    "disk": DiskSender,
}


def sender_kind(transport: str) -> type[Sender]:
    """The Sender class of `transport`; InvalidArgument if none is registered."""
    kind = SENDERS.get(transport)
    if kind is None:
        raise InvalidArgument("transport", f"must be one of {', '.join(SENDERS)} (got {transport!r})")
    return kind
