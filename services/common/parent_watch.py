"""No orphans: a process started by a rollway launcher ends soon after that launcher dies.

    parent side:  subprocess.Popen(cmd, env=child_env(env), process_group=0)
    child side:   watch_parent(on_gone=...)     # once, early; RollwayServer does it for services

The parent passes its pid in ROLLWAY_PARENT_PID. The child then

  - polls getppid(): once the parent is gone the child has been re-parented (to init or a
    subreaper), so getppid() differs from the pid it was given. This also catches a parent that
    died before the child got this far, and it works whichever thread of the parent forked.
  - asks Linux for a death signal (PR_SET_PDEATHSIG) only when the parent says it forked from
    its main thread (ROLLWAY_PARENT_DEATH_SIGNAL=1): the kernel sends it when the *thread* that
    forked exits, so a child started from a short-lived worker thread would be killed while its
    parent lives on. The signal is set in the child itself, after exec: a `preexec_fn` between
    fork and exec may deadlock in a multi-threaded parent.

Both variables are removed from the child's environment once read, so its own children do not
inherit a pid that is not their parent's; they get their own from child_env().
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

PARENT_PID_ENV = "ROLLWAY_PARENT_PID"
DEATH_SIGNAL_ENV = "ROLLWAY_PARENT_DEATH_SIGNAL"
POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1

_parent_pid: int | None = None


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) for a child that must not outlive this process."""
    out = dict(os.environ if env is None else env)
    out[PARENT_PID_ENV] = str(os.getpid())
    if threading.current_thread() is threading.main_thread():
        out[DEATH_SIGNAL_ENV] = "1"  # the main thread lives as long as the process
    else:
        out.pop(DEATH_SIGNAL_ENV, None)
    return out


def parent_gone() -> bool:
    """True once the launcher that started this process (ROLLWAY_PARENT_PID) has died."""
    return _parent_pid is not None and os.getppid() != _parent_pid


def watch_parent(on_gone: Callable[[int], None], death_signal: int = signal.SIGTERM) -> int | None:
    """If a launcher started this process, call `on_gone(parent_pid)` once it dies; return its pid.

    `death_signal` is what the kernel sends at once when the parent dies (where that is safe,
    see the module docstring); `on_gone` runs on a daemon thread within POLL_SECONDS either way.
    Returns None (and watches nothing) when ROLLWAY_PARENT_PID is not set."""
    global _parent_pid
    text = os.environ.pop(PARENT_PID_ENV, "")
    use_signal = os.environ.pop(DEATH_SIGNAL_ENV, "") == "1"
    if not text:
        return None
    _parent_pid = parent = int(text)
    if use_signal and sys.platform.startswith("linux"):
        _set_death_signal(death_signal)

    def watch() -> None:
        # Checked before the first sleep: a parent gone before the signal was set is noticed too.
        while not parent_gone():
            time.sleep(POLL_SECONDS)
        on_gone(parent)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return parent


def _set_death_signal(signum: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    except (OSError, AttributeError):
        pass  # the getppid() watch still ends this process
