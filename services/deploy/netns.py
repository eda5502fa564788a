"""Network namespaces through the `ip` and `tc` tools, and the processes inside them by pid: the
plumbing under NetnsCluster (netns_cluster.py).

    ip("-n", ns, "link", ...)        a command that must succeed (else ClusterError with its stderr)
    ip_quiet("netns", "pids", ns)    one that may fail (a namespace already gone): "" then
    delete_namespace(ns)             SIGKILL every pid in it, then the namespace (its veths go too)
    remove_leftovers()               the namespaces and temp dirs of clusters whose process is gone

It is apart from the cluster so that the cluster reads as nodes, Ray and faults, and so that the
cleanup of a dead process's cluster needs no cluster object. Processes are found by namespace
(`ip netns pids`), never by name: other Ray processes on the machine are never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

COMMAND_TIMEOUT_S = 30.0


class ClusterError(RuntimeError):
    """The cluster could not be built, or a wait on it ran past its deadline; the message says why."""


def run_tool(argv: list[str]) -> str:
    """Run `argv` (an `ip` or `tc` command); its stdout, or ClusterError naming its stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def ip(*args: str) -> str:
    """`ip ARGS`; ClusterError if it fails."""
    return run_tool(["ip", *args])


def ip_quiet(*args: str) -> str:
    """`ip ARGS` where failing is expected (during teardown): its stdout, or "" if it failed."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    return done.stdout if done.returncode == 0 else ""


def kill_pids(pids: list[int]) -> list[int]:
    """SIGKILL each of `pids`; the ones that were still there to kill."""
    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def wait_gone(pids: list[int], timeout: float) -> None:
    """Until none of `pids` is left in /proc, or `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return
        time.sleep(0.05)


def delete_namespace(name: str, rounds: int = 3) -> None:
    """Kill every pid in the namespace, then delete it. A dying process may fork once more, so
    this goes round up to `rounds` times until none is left."""
    for _ in range(rounds):
        pids = [int(p) for p in ip_quiet("netns", "pids", name).split()]
        if not pids:
            break
        kill_pids(pids)
        wait_gone(pids, 10.0)
    ip_quiet("netns", "delete", name)


def remove_leftovers() -> list[str]:
    """Namespaces and temp dirs of clusters whose process is gone (killed before its teardown ran):
    their processes by pid, then the namespaces. A live process's cluster is never touched."""
    removed = []
    for line in ip_quiet("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(r"rw(\d+)\.\d+-(br|n\d+)", name)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        delete_namespace(name, rounds=1)
        removed.append(name)
    for path in Path("/tmp").glob("rw*-*"):
        match = re.fullmatch(r"rw(\d+)\.\d+-\w+", path.name)
        if match and path.is_dir() and not Path(f"/proc/{match.group(1)}").exists():
            shutil.rmtree(path, ignore_errors=True)
    return removed
