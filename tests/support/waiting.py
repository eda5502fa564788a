"""Waiting on a condition with a deadline (never a fixed sleep)."""

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
