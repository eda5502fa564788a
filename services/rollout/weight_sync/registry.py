"""The transport named in a weight manifest -> the Receiver that takes its updates in process.

Adding a transport is a new module beside distributed.py and disk.py (and its twin on the
trainer's side) plus one line here. Tests register fault-injecting receivers with `register`.
"""

from __future__ import annotations

from rollway.common.errors import InvalidArgument
from rollway.rollout.weight_sync.base import Receiver
from rollway.rollout.weight_sync.disk import DiskReceiver
from rollway.rollout.weight_sync.distributed import DistributedReceiver

RECEIVERS: dict[str, Receiver] = {
    "distributed": DistributedReceiver(),
    "disk": DiskReceiver(),
}


def receiver_for(transport: str) -> Receiver:
    """The Receiver of `transport`; InvalidArgument if none is registered."""
    receiver = RECEIVERS.get(transport)
    if receiver is None:
        raise InvalidArgument(
            "manifest.transport", f"must be one of {', '.join(RECEIVERS)} (got {transport!r})"
        )
    return receiver


def register(transport: str, receiver: Receiver) -> Receiver | None:
    """Receive `transport` with `receiver` from now on (in this process); the one it replaces."""
    previous = RECEIVERS.get(transport)
    RECEIVERS[transport] = receiver
    return previous
