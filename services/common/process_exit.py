"""Ending a process that used torch.distributed without interpreter teardown.

Once a process group has existed, gloo's C++ threads can abort the process while static objects
are destroyed at interpreter exit ("terminate called without an active exception", SIGABRT or
SIGSEGV), even after `destroy_process_group()` returned and every peer finished cleanly: about one
exit in ten on this machine. The work is done and written by then, so the exit status must say
so; skipping teardown is the only dependable way.
"""

from __future__ import annotations

import os
import sys

# A trainer whose ranks broke (one died, or a command left them out of step) exits with this so
# that its launcher restarts every rank. EX_TEMPFAIL: temporary, a restart heals it; distinct
# from a start-up error (1) and from a signal (negative).
RANKS_BROKEN_EXIT_CODE = os.EX_TEMPFAIL
EXIT_MEANINGS = {RANKS_BROKEN_EXIT_CODE: "its ranks broke: a rank died or fell out of step"}


def describe_exit(code: int | None) -> str:
    """`exited with N`, and what N means where a rollway process chose it."""
    meaning = EXIT_MEANINGS.get(code)
    return f"exited with {code}" + (f" ({meaning})" if meaning else "")


def exit_without_teardown(code: int) -> None:
    """Flush Python's standard streams and end the process now with `code`."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
