"""Fault injection for weight sync: a distributed receiver that wraps the group it receives on.

    python -m support.weight_faults [--slow-receive SECONDS] [--corrupt-receive] ROLLOUT_ARGS...

runs the rollout service with the faulty receiver registered for the distributed transport (the
production receive loop knows nothing of it). In process, `injected(faulty(...))` registers it
for the duration of a `with` block.

    slow_seconds  sleep this long before posting each piece's receive (a slow receiver, so a
                  test can kill it mid-transfer)
    corrupt       flip one byte of bucket 0's first piece once it arrived, before it is
                  verified (the checksum must catch it)
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from contextlib import contextmanager

import torch

from rollway.common.weight_sync.group import WeightGroup
from rollway.rollout.weight_sync.distributed import DistributedReceiver
from rollway.rollout.weight_sync.registry import ReceiverKind, register
from rollway.rollout.weight_sync.staging import StagingPool


class FaultyGroup:
    """A weight group whose receives are slowed down or damaged; everything else is the group's."""

    def __init__(self, group: WeightGroup, slow_seconds: float, corrupt: bool):
        self._group = group
        self._slow_seconds = slow_seconds
        self._corrupt = corrupt
        self._first: tuple[object, torch.Tensor] | None = None  # (work, tensor) of the first piece

    def broadcast(self, tensor: torch.Tensor, src: int = 0):
        if self._slow_seconds:
            time.sleep(self._slow_seconds)  # the fault itself: a receiver that falls behind
        work = self._group.broadcast(tensor, src=src)
        if self._first is None:
            self._first = (work, tensor)
        return work

    def wait(self, work) -> None:
        self._group.wait(work)
        if self._corrupt and self._first is not None and work is self._first[0]:
            tensor = self._first[1]
            tensor[tensor.numel() // 2] ^= 0x10

    def __getattr__(self, name: str):
        return getattr(self._group, name)


class FaultyReceiver(DistributedReceiver):
    """The distributed transport's receiver on a FaultyGroup around the run's group."""

    def __init__(
        self, group: WeightGroup | None, pool: StagingPool, slow_seconds: float = 0.0, corrupt: bool = False
    ):
        super().__init__(group and FaultyGroup(group, slow_seconds, corrupt), pool)


def faulty(slow_seconds: float = 0.0, corrupt: bool = False) -> ReceiverKind:
    """What makes each update's FaultyReceiver (for `register` or `injected`)."""
    return functools.partial(FaultyReceiver, slow_seconds=slow_seconds, corrupt=corrupt)


@contextmanager
def injected(kind: ReceiverKind, transport: str = "distributed"):
    """Receive `transport` with receivers `kind` makes, in this process, inside the block."""
    previous = register(transport, kind)
    try:
        yield kind
    finally:
        register(transport, previous)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--slow-receive", type=float, default=0.0)
    parser.add_argument("--corrupt-receive", action="store_true")
    faults, rollout_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    register("distributed", faulty(faults.slow_receive, faults.corrupt_receive))
    from rollway.rollout.__main__ import main as rollout_main

    rollout_main(rollout_args)


if __name__ == "__main__":
    main()
