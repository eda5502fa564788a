"""Runs one SGLang server so that it never outlives the rollout service that launched it.

    rollout service ──Popen(new session)──> guard (this file, SGLang's interpreter, stdlib only)
                                                 └──> python -m sglang.launch_server ... (+ the
                                                      scheduler and detokenizer it forks)

Executed by path with the server's own interpreter (`sglang_python`: SGLang lives in its own
virtualenv, which has no rollway), so it imports nothing but the standard library. The guard
leads the process group, so the rollout service's SIGTERM/SIGKILL of the group reaches every
server process. It also:
- ends the group when the rollout service dies (kill -9 included: getppid() changes), which
  the group signal cannot cover since a dead process sends nothing;
- exits with the server's exit code when the server ends, so the supervisor sees a dead server
  at once (a server killed on its own is restarted);
- asks Linux to SIGKILL the server if the guard itself is killed (PR_SET_PDEATHSIG, set in the
  child before exec: the guard has one thread, so that is safe).

    python sglang_guard.py PARENT_PID -- python -m sglang.launch_server ...
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

POLL_SECONDS = 0.5
GRACE_SECONDS = 15.0
PR_SET_PDEATHSIG = 1


def _die_with_guard() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the guard still stops the group when its parent dies


def _stop_group(server: subprocess.Popen) -> int:
    """SIGTERM the whole group but the guard, then SIGKILL what is left after GRACE_SECONDS."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(os.getpgrp(), signal.SIGTERM)
    try:
        return server.wait(GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the guard included: nothing of the group is left
        return -signal.SIGKILL


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: sglang_guard.py PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    parent = int(argv[1])
    server = subprocess.Popen(argv[3:], preexec_fn=_die_with_guard)
    # A signal to the guard alone (not to its group) still stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(_stop_group(server)))
    while True:
        code = server.poll()
        if code is not None:
            return code
        if os.getppid() != parent:
            print(f"sglang_guard: launcher {parent} is gone; stopping the server", file=sys.stderr)
            return _stop_group(server)
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
