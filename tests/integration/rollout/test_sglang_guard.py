"""sglang_guard.py: a launched SGLang server never outlives its rollout service, nor its guard."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager

from support.processes import alive, wait_all_gone
from support.waiting import wait_until

from rollway.rollout.engines.sglang_server import GUARD

# Stands in for launch_server: writes its pid, then serves forever.
SERVER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
# A launcher as the rollout service is one: starts the guard in a new session, then waits.
LAUNCHER = """
import os, subprocess, sys, time
guard = subprocess.Popen([sys.executable, sys.argv[1], str(os.getpid()), "--", *sys.argv[2:]],
                         start_new_session=True)
time.sleep(600)
"""


def _wait_for_pid(path) -> int:
    wait_until(lambda: path.exists() and path.read_text(), timeout=20, what=f"a pid in {path}")
    return int(path.read_text())


def _server_command(tmp_path) -> list[str]:
    return [sys.executable, "-c", SERVER, str(tmp_path / "server.pid")]


def test_the_guard_exits_with_the_server_exit_code():
    guard = subprocess.Popen(
        [sys.executable, str(GUARD), str(os.getpid()), "--", sys.executable, "-c", "raise SystemExit(3)"]
    )
    assert guard.wait(30) == 3


def test_a_launcher_killed_with_sigkill_takes_its_server_along(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(GUARD), *_server_command(tmp_path)])
    try:
        server_pid = _wait_for_pid(tmp_path / "server.pid")
        assert alive(server_pid)
        launcher.kill()
        launcher.wait(10)
        assert wait_all_gone([server_pid], timeout=20) == []
    finally:
        launcher.kill()


@contextmanager
def _guarded_server(tmp_path):
    """(guard process, server pid): a stand-in server under the guard, in its own session."""
    guard = subprocess.Popen(
        [sys.executable, str(GUARD), str(os.getpid()), "--", *_server_command(tmp_path)],
        start_new_session=True,
    )
    try:
        yield guard, _wait_for_pid(tmp_path / "server.pid")
    finally:
        if guard.poll() is None:
            os.killpg(guard.pid, signal.SIGKILL)


def test_a_guard_killed_with_sigkill_takes_its_server_along(tmp_path):
    with _guarded_server(tmp_path) as (guard, server_pid):
        guard.kill()
        guard.wait(10)
        assert wait_all_gone([server_pid], timeout=20) == []


def test_sigterm_to_the_group_stops_guard_and_server(tmp_path):
    with _guarded_server(tmp_path) as (guard, server_pid):
        os.killpg(guard.pid, signal.SIGTERM)
        guard.wait(30)
        assert wait_all_gone([server_pid], timeout=20) == []
