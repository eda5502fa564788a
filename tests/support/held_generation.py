"""Fault injection for generation: the hf engine's decoding holds once a sample has HOLD_AFTER
tokens, until a sample of its batch is aborted.

    python -m support.held_generation [--hold-after TOKENS] ROLLOUT_ARGS...

runs the rollout service with decoding held that way; in process, `held_decoding(n)` holds it
inside a `with` block. A held sample cannot finish, however fast the machine, so a test that
needs samples still generating when an abort or a drain comes has them by construction instead
of by a race between the decoder and the test (issue #36). The production batcher knows nothing
of it: its decode step is wrapped here.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager

from rollway.rollout.engines.hf_batcher import Batcher

HOLD_SECONDS = 120.0  # a held step gives up after this: a test that never aborts fails, not hangs


def _holding(decode_step, hold_after: int):
    held_since: dict[int, float] = {}  # by batcher: when its decoding was first held

    def step(batcher: Batcher) -> None:
        if not any(len(row.tokens) >= hold_after for row in batcher._live) or any(
            row.aborted for row in batcher._live
        ):
            held_since.pop(id(batcher), None)
            decode_step(batcher)  # an aborted row ends at the batcher's next iteration
            return
        # Held: no step, and back to the batcher's loop, which still admits new samples (each gets
        # its first token from the prefill) and drops aborted ones.
        started = held_since.setdefault(id(batcher), time.monotonic())
        if time.monotonic() - started > HOLD_SECONDS:
            raise TimeoutError(f"decoding held {HOLD_SECONDS:.0f} s and nothing was aborted")
        time.sleep(0.01)

    return step


@contextmanager
def held_decoding(hold_after: int):
    """Hold the hf engine's decoding in this process inside the block (see the module doc)."""
    original = Batcher._decode_step
    Batcher._decode_step = _holding(original, hold_after)
    try:
        yield
    finally:
        Batcher._decode_step = original


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--hold-after", type=int, default=8)
    held, rollout_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    Batcher._decode_step = _holding(Batcher._decode_step, held.hold_after)
    from rollway.rollout.__main__ import main as rollout_main

    rollout_main(rollout_args)


if __name__ == "__main__":
    main()
