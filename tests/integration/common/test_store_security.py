"""Stores listen on the run's address only, and a weight group refuses a member without the secret.

The run's address here is 127.0.0.2 (loopback, but not the 127.0.0.1 a wildcard or a host-name
lookup would also answer on), so a socket that listens anywhere else is told apart. Listening
sockets are read from the sockets themselves (psutil); the only traffic goes to loopback.
"""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta

import psutil
import pytest
import torch
import torch.distributed as dist
from support.waiting import wait_until

from rollway.common.bound_store import StoreBindError, host_store, listen_socket
from rollway.common.local_address import address_towards, interface_of
from rollway.common.weight_sync.group import GroupSpec, WeightGroup, WeightGroupError
from rollway.common.weight_sync.group_proof import check_members, group_secret
from rollway.trainer.commands import Checksum, Load
from rollway.trainer.distributed import CommandChannel, CommandRefused, command_key, create_store

RUN_ADDRESS = "127.0.0.2"
TIMEOUT = 60.0


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on."""
    return {
        (c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"
    }


def free_port(address: str = RUN_ADDRESS) -> int:
    with listen_socket(address, 0) as sock:
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "open_store",
    [
        lambda: host_store(RUN_ADDRESS, 0, 1, timedelta(seconds=10)),
        lambda: create_store(0, 1, RUN_ADDRESS, 0, 10.0),  # the trainer's command store
    ],
    ids=["weight-group store", "trainer command store"],
)
def test_a_store_listens_on_its_address_and_nowhere_else(open_store):
    store = open_store()
    try:
        assert {a for a, port in listening(psutil.Process().pid) if port == store.port} == {RUN_ADDRESS}
        with pytest.raises(ConnectionRefusedError):  # 127.0.0.1 is this machine too, but not the run's
            socket.create_connection(("127.0.0.1", store.port), timeout=5).close()
        client = dist.TCPStore(RUN_ADDRESS, store.port, is_master=False, timeout=timedelta(seconds=10))
        client.set("written", b"by a client")
        assert store.get("written") == b"by a client"
    finally:
        port = store.port
        del store
    assert port not in {p for _, p in listening(psutil.Process().pid)}  # closed with the store


def test_a_store_address_that_is_not_this_machines_fails_naming_it():
    with pytest.raises(StoreBindError, match=r"cannot listen on 192\.0\.2\.1:0 .*the run's address"):
        host_store("192.0.2.1", 0, 1, timedelta(seconds=5))  # TEST-NET-1: never a local address


def test_a_port_in_use_is_refused_not_shared():
    with listen_socket(RUN_ADDRESS, 0) as taken:
        with pytest.raises(StoreBindError, match="the port free"):
            host_store(RUN_ADDRESS, taken.getsockname()[1], 1, timedelta(seconds=5))


def spec(port: int, authenticate: bool = True) -> GroupSpec:
    return GroupSpec("g-run", RUN_ADDRESS, port, 2, 1, "gloo", TIMEOUT, authenticate)


class Host:
    """Trainer rank 0 of a weight group in a subprocess, with auth token `token`; it prints
    'joined' and broadcasts [1, 2, 3, 4] once the group formed, or prints the error."""

    def __init__(self, port: int, token: str):
        code = textwrap.dedent(
            f"""
            import sys, torch
            from rollway.common.process_exit import exit_without_teardown
            from rollway.common.weight_sync.group import GroupSpec, WeightGroup, WeightGroupError
            spec = GroupSpec("g-run", {RUN_ADDRESS!r}, {port}, 2, 0, "gloo", {TIMEOUT}, True)
            try:
                group = WeightGroup(spec, rank=0, auth_token={token!r})
            except WeightGroupError as exc:
                print("error:", exc, flush=True)
                exit_without_teardown(3)  # gloo's threads may abort an interpreter teardown
            print("joined", flush=True)
            group.wait(group.broadcast(torch.arange(1.0, 5.0)))
            sys.stdin.readline()
            """
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def output(self) -> str:
        self.proc.stdin.close()
        return self.proc.stdout.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def host():
    started: list[Host] = []
    yield lambda *args: started.append(Host(*args)) or started[-1]
    for h in started:
        h.close()


def test_members_with_the_runs_secret_form_the_group_and_the_host_listens_on_the_run_address(host):
    port = free_port()
    trainer = host(port, "run-token")
    wait_until(lambda: _accepts(port), timeout=TIMEOUT, what="the trainer's store to listen")
    group = WeightGroup(spec(port), rank=1, auth_token="run-token")
    try:
        received = torch.zeros(4)
        group.wait(group.broadcast(received))
        assert received.tolist() == [1.0, 2.0, 3.0, 4.0]
        # The host's store and its gloo connections: all on the run's address, none anywhere else.
        sockets = listening(trainer.proc.pid)
        assert (RUN_ADDRESS, port) in sockets
        assert len(sockets) >= 2, sockets  # the store and gloo's own listener
        assert {address for address, _ in sockets} == {RUN_ADDRESS}
        assert "joined" in trainer.output()
    finally:
        group.destroy()


@pytest.mark.parametrize("member_token", ["", "another-token"])
def test_a_member_without_the_runs_secret_is_refused_on_both_sides(host, member_token):
    port = free_port()
    trainer = host(port, "run-token")
    wait_until(lambda: _accepts(port), timeout=TIMEOUT, what="the trainer's store to listen")
    with pytest.raises(WeightGroupError) as refused:
        WeightGroup(spec(port), rank=1, auth_token=member_token)
    assert "join refused" in str(refused.value)
    assert "auth token differs from the trainer's" in str(refused.value)
    trainer.proc.wait(TIMEOUT)
    out = trainer.output()
    assert trainer.proc.returncode == 3, out
    assert "join refused" in out and "rank(s) 1 did not" in out


def test_a_raw_torch_client_that_takes_a_members_place_is_refused_by_the_host():
    """Someone who reaches the store, lists its keys and joins the gloo rendezvous as rank 1, but
    holds no secret (it answers with a guess): the host refuses the group before any weights move."""
    port = free_port()
    outcome: dict = {}

    def trainer():
        try:
            outcome["group"] = WeightGroup(spec(port), rank=0, auth_token="run-token")
        except WeightGroupError as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    wait_until(lambda: _accepts(port), timeout=30, what="the trainer's store to listen")
    intruder_store = dist.TCPStore(RUN_ADDRESS, port, is_master=False, timeout=timedelta(seconds=30))
    assert intruder_store.list_keys() is not None  # the keys are readable: they cannot hold the secret
    prefixed = dist.PrefixStore("cpu/", dist.PrefixStore("g-run/", dist.PrefixStore("g-run", intruder_store)))
    pg = dist.ProcessGroupGloo(prefixed, 1, 2, timedelta(seconds=30))
    with pytest.raises(RuntimeError, match="join refused"):
        check_members(pg, 1, 2, torch.device("cpu"), group_secret("a-guess", "g-run"))
    thread.join(TIMEOUT)
    assert "group" not in outcome
    assert "join refused" in outcome["error"] and "rank(s) 1 did not" in outcome["error"]


def _accepts(port: int) -> bool:
    try:
        socket.create_connection((RUN_ADDRESS, port), timeout=1).close()
        return True
    except OSError:
        return False


def test_without_authenticate_members_no_proof_is_exchanged(host):
    """The SGLang case: the group forms on the rendezvous alone (a member's token is not asked)."""
    port = free_port()
    outcome: dict = {}

    def trainer():
        outcome["group"] = WeightGroup(spec(port, authenticate=False), rank=0, auth_token="run-token")

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    member = WeightGroup(spec(port, authenticate=False), rank=1, auth_token="")
    thread.join(TIMEOUT)
    try:
        assert "group" in outcome and not member.broken
    finally:
        member.destroy()
        outcome["group"].destroy()


class Exploded(Exception):
    pass


class Payload:
    """Unpickling this runs code: what a forged command would do to a worker that trusts it."""

    def __reduce__(self):
        return (_explode, ())


def _explode():
    raise Exploded("a forged command was unpickled")


def test_a_trainer_command_written_without_the_runs_token_is_refused_before_unpickling():
    store = create_store(0, 2, RUN_ADDRESS, 0, 10.0)
    rank0 = CommandChannel(store, 0, command_key("run-token"))
    worker_store = create_store(1, 2, RUN_ADDRESS, store.port, 10.0)
    worker = CommandChannel(worker_store, 1, command_key("run-token"))
    rank0.send([Load("/ckpt/rank0", 1), Load("/ckpt/iter_1", 1)])
    assert worker.receive(lambda: True) == Load("/ckpt/iter_1", 1)

    # Someone who reaches the store writes the next command: unsigned, or signed with a guess.
    intruder = dist.TCPStore(RUN_ADDRESS, store.port, is_master=False, timeout=timedelta(seconds=10))
    for forged in (pickle.dumps(("train_step", Payload())), b"\0" * 32 + pickle.dumps(("x", Payload()))):
        intruder.set("cmd/1/1", forged)
        with pytest.raises(CommandRefused, match="refused command cmd/1/1: its signature does not verify"):
            worker.receive(lambda: True)

    # A worker whose token differs from rank 0's refuses rank 0's own commands too.
    stranger = CommandChannel(worker_store, 1, command_key("another-token"))
    stranger.seq = 1
    rank0.send([Checksum("float32"), Checksum("bfloat16")])
    with pytest.raises(CommandRefused):
        stranger.receive(lambda: True)
    assert worker.receive(lambda: True) == Checksum("bfloat16")


def test_the_trainer_ranks_gloo_interface_is_the_one_holding_the_runs_address():
    loopback = interface_of("127.0.0.1")
    assert loopback is not None
    assert interface_of(RUN_ADDRESS) == interface_of("localhost") == loopback  # all of 127/8, by name too
    assert address_towards(RUN_ADDRESS, 29500) == "127.0.0.1"  # a route lookup: nothing is sent
