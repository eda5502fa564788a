"""The weight-sync process group: trainer rank 0 (the source) plus every rollout engine worker.

    trainer rank 0:   WeightGroup(spec, rank=0)            hosts a TCPStore on master_address:master_port
    rollout service:  WeightGroup(spec, rank=rank_offset)  connects to it
    both:             ProcessGroupGloo / ProcessGroupNCCL built directly on that store, then
                      (authenticate_members) every member proves the run's secret (group_proof)

Why a backend object built on its own store rather than `dist.init_process_group` or
`dist.new_group`: the trainer process already has its default group (its FSDP ranks), a
process can have only one, and `new_group` only takes ranks of that default group. Torch's
public `ProcessGroupGloo(store, rank, size, timeout)` (and `ProcessGroupNCCL(store, rank, size,
options)`) construct a separate group between any processes that share a store, need no private
c10d helpers, and work the same with torch 2.13 on CPU (gloo) and CUDA (NCCL). Collectives are
called on the object (`group.broadcast`), never through `dist.*` with a default group.

Store keys use the prefixes of SGLang's `init_custom_process_group` (group name, then
"<group name>/", then "<device>/"), so SGLang servers joining with /init_weights_update_group
meet the trainer's keys. A collective that does not complete within `timeout_seconds` fails, and
a member that dies makes its peers' collectives fail at once ("Connection closed by peer"): no
member ever hangs. After any failure the group is unusable: destroy it and create a new one.

A dead peer is noticed within seconds, not after `timeout_seconds`:
- a member first waits for the store to listen, probing in short slices, and for the store to be
  this group's (connect_group_store: on a fixed port the previous group's may still be up); refused for
  REFUSED_GRACE_SECONDS means the host is gone (or never formed the group), and it fails then
  (torch's TCPStore client would retry a refused connection until the timeout);
- the rendezvous runs on a daemon thread that the caller waits for in slices, so `cancel` (the
  service leaving the group or stopping) ends the wait at once; a store host that dies makes the
  rendezvous fail by itself (the store connection closes);
- `wait(work)` waits for a gloo collective in slices, so destroy() from another thread ends it
  (gloo's abort does not wake a waiter), and a stuck collective never holds a stopping service;
- a gloo group destroyed with a collective still in flight is kept, never freed: freeing it joins
  its worker threads, which wait for the peer until the group timeout.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rollway.common import progress
from rollway.common.bound_store import host_store
from rollway.common.log import get_logger
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.group_proof import check_members, group_secret

BACKENDS = ("gloo", "nccl")
log = get_logger("rollway.weight_group")
# How often a blocked join or collective looks for cancellation, destroy() or its deadline.
POLL_SECONDS = 0.5
# A store port refusing connections this long (at most the group timeout) has no host coming.
REFUSED_GRACE_SECONDS = 5.0
# The key under which rank 0's store holds the group's name (connect_group_store).
HOST_KEY = "rollway/weight_group"
# How long a member's first connection to the store, and its read of HOST_KEY, may take.
STORE_PROBE_SECONDS = 2.0
# Groups destroyed with collectives in flight, with those collectives (see destroy()).
_ABANDONED: list[tuple[Any, list[Any]]] = []


class WeightGroupError(RuntimeError):
    """The group could not be formed, or a collective on it failed."""


@dataclass(frozen=True)
class GroupSpec:
    """WeightGroupSpec as a value (its equality is InitWeightGroup's idempotency key)."""

    group_name: str
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int
    backend: str
    timeout_seconds: float
    authenticate_members: bool = False

    @classmethod
    def from_proto(cls, spec: common_pb2.WeightGroupSpec) -> GroupSpec:
        """The spec, validated; ValueError("<field>: <problem>") for the first bad field."""
        checks = [
            (spec.group_name, "group.group_name", "must not be empty"),
            (spec.master_address, "group.master_address", "must not be empty"),
            (
                0 < spec.master_port < 65536,
                "group.master_port",
                f"must be in 1..65535 (got {spec.master_port})",
            ),
            (spec.world_size >= 2, "group.world_size", f"must be at least 2 (got {spec.world_size})"),
            (
                0 <= spec.rank_offset < max(spec.world_size, 1),
                "group.rank_offset",
                f"must be in [0, world_size) (got {spec.rank_offset})",
            ),
            (
                spec.backend in BACKENDS,
                "group.backend",
                f"must be one of {', '.join(BACKENDS)} (got {spec.backend!r})",
            ),
            (
                spec.timeout_seconds > 0,
                "group.timeout_seconds",
                f"must be positive (got {spec.timeout_seconds})",
            ),
        ]
        for ok, field, problem in checks:
            if not ok:
                raise ValueError(f"{field}: {problem}")
        return cls(
            spec.group_name,
            spec.master_address,
            spec.master_port,
            spec.world_size,
            spec.rank_offset,
            spec.backend,
            spec.timeout_seconds,
            spec.authenticate_members,
        )


class WeightGroup:
    """One member's handle on the group; rank 0 hosts the store.

    Joining blocks until every member joined (or fails, see the module doc); setting `cancel`
    from another thread makes a join in progress fail within POLL_SECONDS. Rank 0's store listens
    on `spec.master_address` only. With `spec.authenticate_members`, every member proves the
    secret derived from `auth_token` before the group is usable (rollway.common.weight_sync.group_proof)."""

    def __init__(
        self, spec: GroupSpec, rank: int, cancel: threading.Event | None = None, auth_token: str = ""
    ):
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"rank {rank} is outside the group (world_size {spec.world_size})")
        if spec.backend == "nccl" and not torch.cuda.is_available():
            raise WeightGroupError("backend nccl needs a CUDA device (use gloo on CPU)")
        self.spec = spec
        self.rank = rank
        self.broken: str | None = None
        self._destroyed = threading.Event()
        self._works: list[Any] = []  # collectives started and maybe not finished
        cancel = cancel or threading.Event()
        timeout = timedelta(seconds=spec.timeout_seconds)
        deadline = time.monotonic() + spec.timeout_seconds
        try:
            # gloo's own connections listen on this member's address towards the store, not on
            # the address its host name resolves to (often the machine's external one).
            if rank == 0:
                local_address = spec.master_address
                self._store = host_group_store(spec)
            else:
                self._store, local_address = connect_group_store(spec, deadline, cancel)
            self._store.set_timeout(timeout)
            log.info("weight group rendezvous", group=spec.group_name, rank=rank, world_size=spec.world_size)
            device = "cuda" if spec.backend == "nccl" else "cpu"
            store = dist.PrefixStore(
                f"{device}/",
                dist.PrefixStore(f"{spec.group_name}/", dist.PrefixStore(spec.group_name, self._store)),
            )
            secret = group_secret(auth_token, spec.group_name) if spec.authenticate_members else None
            self._pg = _in_slices(
                lambda: self._form(store, rank, spec, timeout, local_address, secret), deadline, cancel
            )
        except (RuntimeError, ValueError) as exc:  # c10d raises RuntimeError subclasses (DistStoreError, ...)
            self.destroy()
            raise WeightGroupError(
                f"weight group {spec.group_name!r} at {spec.master_address}:{spec.master_port} "
                f"(rank {rank} of {spec.world_size}) could not be formed: {str(exc).splitlines()[0]}"
            ) from None

    def _form(self, store, rank: int, spec: GroupSpec, timeout: timedelta, local_address: str, secret):
        """The rendezvous, then (with a secret) the members' proofs; a refused group is aborted."""
        pg = self._backend(store, rank, spec, timeout, local_address)
        if secret is not None:
            try:
                check_members(pg, rank, spec.world_size, self.device, secret)
            except RuntimeError:
                pg.abort()
                raise
        return pg

    @staticmethod
    def _backend(store, rank: int, spec: GroupSpec, timeout: timedelta, local_address: str):
        if spec.backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address)]
            return dist.ProcessGroupGloo(store, rank, spec.world_size, options)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, spec.world_size, options)

    @property
    def device(self) -> torch.device:
        """Where tensors of this group's collectives live."""
        return (
            torch.device("cuda", torch.cuda.current_device())
            if self.spec.backend == "nccl"
            else torch.device("cpu")
        )

    def broadcast(self, tensor: torch.Tensor, src: int = 0):
        """Start a broadcast of `tensor` from `src`; returns the work (call .wait())."""
        if self.broken:
            raise WeightGroupError(f"weight group {self.spec.group_name!r} is broken: {self.broken}")
        options = dist.BroadcastOptions()
        options.rootRank = src
        progress.beat()  # the previous piece went through (buffers are reused only after a wait)
        return self._started(self._pg.broadcast([tensor], options))

    def _started(self, work):
        self._works = [w for w in self._works if not w.is_completed()]
        self._works.append(work)
        return work

    def exchange_status(self, code: int) -> list[int]:
        """Every member contributes one status code; every member gets all of them, by rank.

        The end-of-update acknowledgement: the sender learns whether each receiver verified."""
        if self.broken:
            raise WeightGroupError(f"weight group {self.spec.group_name!r} is broken: {self.broken}")
        mine = torch.tensor([code], dtype=torch.int64, device=self.device)
        gathered = [torch.zeros_like(mine) for _ in range(self.spec.world_size)]
        try:
            self.wait(self._started(self._pg.allgather([gathered], [mine])))
        except RuntimeError as exc:
            self.mark_broken(str(exc))
            raise WeightGroupError(f"status exchange failed: {str(exc).splitlines()[0]}") from None
        return [int(t.item()) for t in gathered]

    def wait(self, work) -> None:
        """Wait for a collective started on this group; RuntimeError when it fails.

        On gloo, in slices of POLL_SECONDS: destroy() from another thread (a service stopping)
        ends the wait within one slice; gloo's own timeout still fails a stuck collective. On
        nccl, work.wait() only orders the CUDA stream and returns at once."""
        if self.spec.backend != "gloo":
            work.wait()
            return
        while True:
            try:
                work.wait(timedelta(seconds=POLL_SECONDS))
                progress.beat()
                return
            except RuntimeError as exc:
                if "timed out" not in str(exc).lower():
                    raise  # the collective itself failed
                if work.is_completed():
                    # It finished between the slice's timeout and now: its own outcome counts
                    # (a bucket that arrived is not a failed push), gloo's timeout error included.
                    work.wait()
                    progress.beat()
                    return
            if self._destroyed.is_set():
                raise RuntimeError(f"the weight group was left while waiting ({self.broken})")

    def mark_broken(self, reason: str) -> None:
        """Record a failed collective: the group must be rebuilt before it is used again."""
        self.broken = self.broken or reason

    def destroy(self) -> None:
        """Abort pending collectives (peers fail at once) and close the store."""
        pg, self._pg = getattr(self, "_pg", None), None
        if pg is not None:
            try:
                pg.abort()
            except RuntimeError:  # already failed or shut down
                pass
            in_flight = [w for w in getattr(self, "_works", []) if not w.is_completed()]
            if in_flight:  # freeing the group now would block until its peers time out
                _ABANDONED.append((pg, in_flight))
            self._works = []
        self._store = None
        self.broken = self.broken or "destroyed"
        self._destroyed.set()


def host_group_store(spec: GroupSpec) -> dist.TCPStore:
    """Rank 0's store for the group, on the group's address, naming the group (HOST_KEY)."""
    store = host_store(
        spec.master_address, spec.master_port, spec.world_size, timedelta(seconds=spec.timeout_seconds)
    )
    store.set(HOST_KEY, spec.group_name)
    return store


def connect_group_store(
    spec: GroupSpec, deadline: float, cancel: threading.Event
) -> tuple[dist.TCPStore, str]:
    """A client of this group's own store, and this machine's address on the way to it.

    On a fixed master_port the store listening there may still be the previous group's: its host
    closes it only when its own InitWeightGroup for the new group arrives, which can come after
    this member's. A member that joined that store would fail when it closes ("Broken pipe") and
    leave the host waiting out the group timeout. So the member reads the name the host wrote
    (HOST_KEY) and waits, until the deadline, for a store that names this group."""
    while True:
        local_address = _wait_for_listener(spec, deadline, cancel)
        try:
            hosted = _store_client(spec).get(HOST_KEY).decode()  # a probe, closed at once
            if hosted == spec.group_name:
                return _store_client(spec), local_address
        except RuntimeError as exc:  # c10d's DistNetworkError, DistStoreError: closed, or no name yet
            hosted = f"none readable ({str(exc).splitlines()[0]})"
        log.info(
            "the store hosts another group; waiting for this one's", group=spec.group_name, hosted=hosted
        )
        if cancel.wait(max(min(POLL_SECONDS, deadline - time.monotonic()), 0)):
            _check_cancel(cancel)
        if time.monotonic() >= deadline:
            raise WeightGroupError(
                f"the store at {spec.master_address}:{spec.master_port} hosted group {hosted!r}, not "
                f"{spec.group_name!r}, until the timeout of {spec.timeout_seconds:g}s"
            )


def _store_client(spec: GroupSpec) -> dist.TCPStore:
    """A client of the store at the group's address. A short connect (and read) timeout: a store
    that closes in between is tried again, not waited on for the whole group timeout."""
    return dist.TCPStore(
        spec.master_address,
        spec.master_port,
        spec.world_size,
        is_master=False,
        timeout=timedelta(seconds=min(STORE_PROBE_SECONDS, spec.timeout_seconds)),
        wait_for_workers=False,
    )


def _wait_for_listener(spec: GroupSpec, deadline: float, cancel: threading.Event) -> str:
    """Once something listens at the store's address: this machine's address on the way there.
    WeightGroupError if nothing does.

    Refused connections are expected for a moment (the trainer opens the store as its own
    InitWeightGroup arrives) but not for REFUSED_GRACE_SECONDS: then nothing is coming."""
    address = (spec.master_address, spec.master_port)
    grace = min(REFUSED_GRACE_SECONDS, spec.timeout_seconds)
    refused_since: float | None = None
    while True:
        _check_cancel(cancel)
        now = time.monotonic()
        try:
            with socket.create_connection(
                address, timeout=max(min(POLL_SECONDS, deadline - now), 0.01)
            ) as probe:
                return probe.getsockname()[0]
        except ConnectionRefusedError:
            refused_since = now if refused_since is None else refused_since
            if now - refused_since >= grace:
                raise WeightGroupError(
                    f"nothing listens at {address[0]}:{address[1]} (connection refused for {grace:g}s): "
                    "the trainer that hosts the group's store is gone or did not form this group"
                ) from None
        except OSError as exc:  # unreachable, or no answer yet: keep trying until the deadline
            refused_since = None
            if time.monotonic() >= deadline:
                raise WeightGroupError(
                    f"the store at {address[0]}:{address[1]} was not reachable within the timeout of "
                    f"{spec.timeout_seconds:g}s ({exc})"
                ) from None
        if cancel.wait(max(min(POLL_SECONDS, deadline - time.monotonic()), 0)):
            _check_cancel(cancel)
        if time.monotonic() >= deadline:
            raise WeightGroupError(
                f"the store at {address[0]}:{address[1]} did not accept connections within the timeout "
                f"of {spec.timeout_seconds:g}s"
            )


def _check_cancel(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise WeightGroupError("cancelled: this member left the group (closing or stopping)")


def _in_slices(form: Callable[[], Any], deadline: float, cancel: threading.Event) -> Any:
    """Run the rendezvous `form()` on a daemon thread and wait for it in slices.

    A cancelled wait returns at once; the abandoned thread ends with the rendezvous (its store
    connection closing, or the group timeout) and, being a daemon, never holds up an exit."""
    result: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            result["value"] = form()
        except BaseException as exc:  # handed to the waiting thread
            result["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="weight-group-rendezvous", daemon=True).start()
    # The rendezvous has its own timeout; the margin lets it report its own error first.
    while not done.wait(POLL_SECONDS):
        _check_cancel(cancel)
        if time.monotonic() > deadline + 5 * POLL_SECONDS:
            raise WeightGroupError("timeout: the members did not all join within the group timeout")
    if "error" in result:
        raise result["error"]
    return result["value"]


# Status codes of the end-of-update acknowledgement (exchange_status); the sender contributes OK.
STATUS_OK = 0  # every bucket verified: the receiver commits the version
STATUS_ALREADY_APPLIED = 1  # the receiver already served this version: received and dropped
STATUS_CHECKSUM_MISMATCH = 2  # a bucket did not match its checksum: not committed
STATUS_REFUSED = 3  # the update does not fit the served model, or goes backwards: not committed
STATUS_NAMES = {
    STATUS_OK: "verified",
    STATUS_ALREADY_APPLIED: "already applied",
    STATUS_CHECKSUM_MISMATCH: "checksum mismatch",
    STATUS_REFUSED: "refused",
}
