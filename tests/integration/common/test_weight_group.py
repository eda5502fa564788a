"""The weight group notices a dead or absent peer within seconds, and a leaving member never waits.

Rank 0 (the store host, as the trainer) runs in a real subprocess that the tests kill; the member
is this process, as the rollout service is.
"""

from __future__ import annotations

import datetime
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from support.ports import free_port
from support.waiting import names_a_gone_peer, wait_until

from rollway.common.weight_sync import group as group_module
from rollway.common.weight_sync.group import (
    POLL_SECONDS,
    REFUSED_GRACE_SECONDS,
    GroupSpec,
    WeightGroup,
    WeightGroupError,
)

TIMEOUT = 120.0  # the group timeout: every failure below must come long before it


def spec(port: int, world_size: int = 2) -> GroupSpec:
    return GroupSpec("g", "127.0.0.1", port, world_size, 1, "gloo", TIMEOUT)


class Host:
    """Rank 0 in a subprocess; it logs "weight group rendezvous" once its store listens, and prints
    'joined' once the group formed; then, with `broadcast`, waits for a line on stdin and
    broadcasts [1, 2, 3, 4] (printing 'sent'). With `held`, it prints 'ready' once imported and
    opens its store only at a line on stdin."""

    def __init__(
        self, port: int, world_size: int = 2, broadcast: bool = False, held: bool = False, name: str = "g"
    ):
        code = textwrap.dedent(
            f"""
            import sys, torch
            from rollway.common.weight_sync.group import GroupSpec, WeightGroup
            spec = GroupSpec({name!r}, "127.0.0.1", {port}, {world_size}, 0, "gloo", {TIMEOUT})
            if {held}:
                print("ready", flush=True)
                sys.stdin.readline()
            group = WeightGroup(spec, rank=0)
            print("joined", flush=True)
            if {broadcast}:
                sys.stdin.readline()
                group.wait(group.broadcast(torch.arange(1.0, 5.0)))
                print("sent", flush=True)
            sys.stdin.readline()
            """
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def expect(self, fragment: str, timeout: float = 60.0) -> None:
        """Wait for an output line containing `fragment`."""
        found = threading.Event()
        seen: list[str] = []

        def read():
            for line in self.proc.stdout:
                seen.append(line.strip())
                if fragment in line:
                    found.set()
                    return

        threading.Thread(target=read, daemon=True).start()
        assert found.wait(timeout), f"rank 0 printed {seen} (exit code {self.proc.poll()})"

    def send(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def kill(self, signum: int) -> None:
        self.proc.send_signal(signum)
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def hosts():
    started: list[Host] = []
    yield lambda *args, **kwargs: started.append(Host(*args, **kwargs)) or started[-1]
    for host in started:
        host.close()


def store_keys(port: int) -> int:
    """How many keys rank 0's store holds (a member in the rendezvous has written its own)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    return store.num_keys()


def host_keys(port: int) -> int:
    """The keys rank 0 writes by itself (the group's name, then its own rendezvous key), once both
    are there: a member's keys come on top of these."""
    wait_until(lambda: store_keys(port) >= 2, timeout=30, what="rank 0's own keys in its store")
    return store_keys(port)


def wait_for_member(port: int, keys_before: int, thread: threading.Thread, timeout: float = 30.0) -> None:
    """Wait until the joining member has reached rank 0's store (its keys are there)."""
    deadline = time.monotonic() + timeout
    while store_keys(port) <= keys_before:
        assert thread.is_alive(), "the member stopped joining before it reached the store"
        assert time.monotonic() < deadline, "the member never reached rank 0's store"
        time.sleep(0.05)


def join_in_thread(group_spec: GroupSpec, cancel: threading.Event | None = None):
    """Join as rank 1 on a thread; returns (thread, outcome) with outcome filled when it ends."""
    outcome: dict = {}

    def run():
        started = time.monotonic()
        try:
            outcome["group"] = WeightGroup(group_spec, rank=1, cancel=cancel)
        except WeightGroupError as exc:
            outcome["error"] = str(exc)
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_store_nobody_hosts_fails_after_the_refused_grace_not_the_timeout():
    started = time.monotonic()
    with pytest.raises(WeightGroupError) as info:
        WeightGroup(spec(free_port()), rank=1)
    seconds = time.monotonic() - started
    assert REFUSED_GRACE_SECONDS <= seconds < REFUSED_GRACE_SECONDS + 3
    assert "nothing listens at 127.0.0.1:" in str(info.value)
    assert "the trainer that hosts the group's store is gone" in str(info.value)


def test_a_member_joining_before_the_host_opens_its_store_still_joins(hosts, monkeypatch):
    port = free_port()
    host = hosts(port, held=True)
    host.expect("ready")  # imported: once let go it opens its store well within the grace
    refusals = []
    connect = socket.create_connection

    def counting_connect(*args, **kwargs):
        try:
            return connect(*args, **kwargs)
        except ConnectionRefusedError:
            refusals.append(time.monotonic())
            raise

    monkeypatch.setattr(socket, "create_connection", counting_connect)
    thread, outcome = join_in_thread(spec(port))
    wait_until(lambda: refusals, timeout=30, what="the member to be refused by the unopened store")
    host.send()  # the host turns up within the grace
    host.expect("weight group rendezvous")
    host.expect("joined")
    thread.join(30)
    assert "group" in outcome, outcome
    outcome["group"].destroy()


def test_a_member_waits_for_its_own_groups_store_on_a_port_the_previous_group_still_holds(hosts, monkeypatch):
    """A rebuilt group on a fixed port: the previous group's store may still listen there (its host
    replaces it when its own InitWeightGroup arrives, which can come second). The member must not
    join that store (it would fail as the store closes, and the new host would wait out the
    timeout): it waits for the store that names its group, and joins that one."""
    port = free_port()
    previous = hosts(port, world_size=3, name="previous")  # its rendezvous never completes
    previous.expect("weight group rendezvous")
    seen_hosting = []
    info = group_module.log.info
    monkeypatch.setattr(
        group_module.log,
        "info",
        lambda event, **kw: (seen_hosting.append(kw.get("hosted")), info(event, **kw)),
    )
    thread, outcome = join_in_thread(spec(port))
    wait_until(
        lambda: "previous" in seen_hosting, timeout=30, what="the member to find the previous group's store"
    )
    assert thread.is_alive()
    previous.close()
    current = hosts(port)
    current.expect("joined")
    thread.join(30)
    assert "group" in outcome, outcome
    outcome["group"].destroy()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_host_that_dies_during_the_rendezvous_fails_the_join_at_once(hosts, signum):
    port = free_port()
    host = hosts(port, world_size=3)  # rank 2 never comes: the rendezvous waits
    host.expect("weight group rendezvous")
    before = host_keys(port)
    thread, outcome = join_in_thread(spec(port, world_size=3))
    wait_for_member(port, before, thread)
    assert thread.is_alive()
    died = time.monotonic()
    host.kill(signum)
    thread.join(10)
    assert not thread.is_alive() and "error" in outcome
    assert time.monotonic() - died < 5, outcome
    assert "could not be formed" in outcome["error"] and names_a_gone_peer(outcome["error"]), outcome["error"]


def test_cancel_ends_a_join_in_progress_at_once(hosts):
    port = free_port()
    host = hosts(port, world_size=3)
    host.expect("weight group rendezvous")
    cancel = threading.Event()
    before = host_keys(port)
    thread, outcome = join_in_thread(spec(port, world_size=3), cancel)
    wait_for_member(port, before, thread)
    cancelled = time.monotonic()
    cancel.set()
    thread.join(10)
    assert time.monotonic() - cancelled < 2 * POLL_SECONDS + 0.5
    assert "cancelled: this member left the group" in outcome["error"]


def test_leaving_the_group_ends_a_collective_waiting_on_a_live_peer_and_a_dead_peer_fails_it(hosts):
    port = free_port()
    host = hosts(port, broadcast=True)
    host.expect("weight group rendezvous")
    group = WeightGroup(spec(port), rank=1)
    host.expect("joined")
    received = torch.zeros(4)
    host.send()
    group.wait(group.broadcast(received))
    host.expect("sent")
    assert received.tolist() == [1.0, 2.0, 3.0, 4.0]

    # The host is alive but sends nothing: destroy() on another thread ends the wait.
    work = group.broadcast(torch.zeros(4))
    threading.Timer(1.0, group.destroy).start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the weight group was left while waiting"):
        group.wait(work)
    assert time.monotonic() - started < 1.0 + 2 * POLL_SECONDS + 0.5

    host.close()
    port = free_port()
    host = hosts(port, broadcast=True)
    host.expect("weight group rendezvous")
    group = WeightGroup(spec(port), rank=1)
    host.expect("joined")
    work = group.broadcast(torch.zeros(4))
    died = time.monotonic()
    host.kill(signal.SIGKILL)
    with pytest.raises(RuntimeError, match="Connection (closed|reset) by peer"):
        group.wait(work)
    assert time.monotonic() - died < 5
    group.destroy()
