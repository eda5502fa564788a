"""The transport named in a weight manifest -> the kind of Receiver that takes its updates in
process (made for each update with the run's weight group and staging pool).

Adding a transport is a new module beside distributed.py and disk.py (and its twin on the
trainer's side) plus one line here. Tests register fault-injecting receivers with `register`.
"""

from __future__ import annotations

from collections.abc import Callable

from rollway.common.errors import InvalidArgument
from rollway.common.weight_sync.group import WeightGroup
from rollway.rollout.weight_sync.base import Receiver
from rollway.rollout.weight_sync.disk import DiskReceiver
from rollway.rollout.weight_sync.distributed import DistributedReceiver
from rollway.rollout.weight_sync.staging import StagingPool

ReceiverKind = Callable[[WeightGroup | None, StagingPool], Receiver]

RECEIVERS: dict[str, ReceiverKind] = {
    "distributed": DistributedReceiver,
    "disk": DiskReceiver,
}


def receiver_kind(transport: str) -> ReceiverKind:
    """What makes the Receiver of `transport`; InvalidArgument if none is registered."""
    kind = RECEIVERS.get(transport)
    if kind is None:
        raise InvalidArgument(
            "manifest.transport", f"must be one of {', '.join(RECEIVERS)} (got {transport!r})"
        )
    return kind


def register(transport: str, kind: ReceiverKind) -> ReceiverKind | None:
    """Receive `transport` with receivers `kind` makes from now on (in this process); the one it replaces."""
    previous = RECEIVERS.get(transport)
    RECEIVERS[transport] = kind
    return previous
