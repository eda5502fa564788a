"""The trainer's process group and the command channel from rank 0 to the other ranks.

    rank 0 (gRPC)                         ranks 1..N-1 (worker loop)
    CommandChannel.send(commands)    -> TCPStore key cmd/<seq>/<rank> -> CommandChannel.receive()
    execute(engine, commands[0])          <- same collectives ->            execute(engine, commands[r])

Commands travel through rank 0's TCPStore rather than a collective: a worker may wait for its
next command for hours, and a collective would time out; a store wait is polled in short slices
so the worker can notice that rank 0 is gone. Each rank gets its own command (commands.py: its
share of the batch), planned and validated on rank 0 before anything is sent, so a bad batch never reaches a
worker and all ranks always run the same sequence of collectives.

Whoever reaches a TCPStore can write its keys, and a command is unpickled (which can run code), so
each one is signed (HMAC keyed by the services' auth token, over its key and bytes) and a worker
refuses one that does not verify before unpickling anything. Rank 0's store listens on `addr` only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rollway.common.bound_store import host_store
from rollway.common.local_address import address_towards, interface_of

POLL_SECONDS = 1.0
SIGNATURE_BYTES = 32
# GLOO_SOCKET_IFNAME as the user set it (None: rollway picks the interface that reaches rank 0).
_USER_GLOO_IFNAME = os.environ.get("GLOO_SOCKET_IFNAME")


@dataclass
class RankInfo:
    """Where this process sits in the trainer's group."""

    rank: int
    world_size: int
    device: torch.device
    backend: str


def pick_device(rank: int) -> tuple[torch.device, str]:
    """cuda:<local rank> with NCCL when a GPU is present, else CPU with gloo."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "cpu:gloo,cuda:nccl"
    return torch.device("cpu"), "gloo"


def create_store(rank: int, world_size: int, addr: str, port: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0 hosts the store on `addr` only (port 0 picks a free port: read store.port); others
    connect to it. The store carries the ranks' commands, so it must not listen on every interface."""
    if rank == 0:
        return host_store(addr, port, world_size, timedelta(seconds=timeout_s))
    return dist.TCPStore(
        addr,
        port,
        world_size,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def init_process_group(store: dist.TCPStore, rank: int, world_size: int, timeout_s: float) -> RankInfo:
    """Join the trainer's default process group (gloo on CPU, NCCL for CUDA tensors)."""
    device, backend = pick_device(rank)
    _gloo_listens_towards(store, rank)
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore("pg", store),
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return RankInfo(rank=rank, world_size=world_size, device=device, backend=backend)


def _gloo_listens_towards(store: dist.TCPStore, rank: int) -> None:
    """Make gloo's connections listen on the interface that reaches rank 0's store.

    Left alone, gloo listens on the address the machine's host name resolves to, often its
    external one, even for a run on loopback. `dist.init_process_group` takes no gloo device, so
    this goes through gloo's own setting, GLOO_SOCKET_IFNAME (kept when the user set it)."""
    if _USER_GLOO_IFNAME is not None or not isinstance(store, dist.TCPStore):
        return  # the user's choice; or a FileStore (tests on one machine): no address to follow
    local = store.host if rank == 0 else address_towards(store.host, store.port)
    interface = interface_of(local)
    if interface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface


def command_key(auth_token: str) -> bytes:
    """The key that signs the ranks' commands, derived from the services' auth token ("" without)."""
    return hmac.new(auth_token.encode(), b"rollway trainer commands", hashlib.sha256).digest()


class CommandRefused(SystemExit):
    """A command whose signature does not verify: the worker exits without unpickling it."""


class CommandChannel:
    """Rank 0 sends a command to every worker; workers receive them in order."""

    def __init__(self, store: dist.TCPStore, rank: int, key: bytes):
        self.store = store
        self.rank = rank
        self.key = key
        self.seq = 0

    def _signature(self, name: str, blob: bytes) -> bytes:
        return hmac.new(self.key, name.encode() + b"\0" + blob, hashlib.sha256).digest()

    def send(self, commands: list[Any]) -> None:
        """Rank 0: post `commands[r]` for every worker rank r >= 1."""
        for rank, command in enumerate(commands[1:], start=1):
            name = f"cmd/{self.seq}/{rank}"
            blob = pickle.dumps(command)
            self.store.set(name, self._signature(name, blob) + blob)
        self.seq += 1

    def receive(self, still_wanted) -> Any:
        """Worker: wait for the next command; `still_wanted()` False (rank 0 gone) raises SystemExit."""
        key = f"cmd/{self.seq}/{self.rank}"
        while True:
            try:
                self.store.wait([key], timedelta(seconds=POLL_SECONDS))
                break
            except Exception as exc:  # a wait timeout, or the store (rank 0) went away
                if not still_wanted() or "timeout" not in str(exc).lower():
                    raise SystemExit(f"rank {self.rank}: rank 0 is gone ({exc})") from None
        signed = self.store.get(key)
        signature, blob = signed[:SIGNATURE_BYTES], signed[SIGNATURE_BYTES:]
        if not hmac.compare_digest(signature, self._signature(key, blob)):
            raise CommandRefused(
                f"rank {self.rank}: refused command {key}: its signature does not verify (written by "
                "someone without the run's auth token, or rank 0's token differs from this rank's)"
            )
        command = pickle.loads(blob)
        self.store.delete_key(key)
        self.seq += 1
        return command

    def report_error(self, message: str) -> None:
        """Worker: leave an error message for rank 0 before exiting."""
        try:
            self.store.set(f"error/{self.rank}", message.encode()[-4000:])
        except Exception:  # the store may be gone as well; exiting is what matters
            pass

    def read_error(self, rank: int) -> str:
        """Rank 0: the message a worker left before it died, if any."""
        try:
            if self.store.check([f"error/{rank}"]):
                return self.store.get(f"error/{rank}").decode(errors="replace")
        except Exception:
            pass
        return ""
