"""Waiting on a condition with a deadline (never a fixed sleep), and reading what a wait ended with."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], object], timeout: float = 10.0, what: str = "the condition", poll: float = 0.02
) -> None:
    """Poll `condition` until it is true; fail the test naming `what` once `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(poll)


# How c10d words a store whose host went away; which one depends on the moment it is noticed
# (an open connection closed, reset, or written to after the peer closed it, or a new connection gloo
# opens to the store failing).
PEER_GONE = (
    "Connection was likely closed",
    "Connection reset by peer",
    "Broken pipe",
    "while trying to connect to",
)


def names_a_gone_peer(message: str) -> bool:
    return any(wording in message for wording in PEER_GONE)
