"""The weight-sync process group: trainer rank 0 (the source) plus every rollout engine worker.

    trainer rank 0:   WeightGroup(spec, rank=0)            hosts a TCPStore on master_port
    rollout service:  WeightGroup(spec, rank=rank_offset)  connects to it
    both:             ProcessGroupGloo / ProcessGroupNCCL built directly on that store

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
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from rollway.common.v1 import common_pb2

BACKENDS = ("gloo", "nccl")


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
        )


class WeightGroup:
    """One member's handle on the group; rank 0 hosts the store."""

    def __init__(self, spec: GroupSpec, rank: int):
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"rank {rank} is outside the group (world_size {spec.world_size})")
        if spec.backend == "nccl" and not torch.cuda.is_available():
            raise WeightGroupError("backend nccl needs a CUDA device (use gloo on CPU)")
        self.spec = spec
        self.rank = rank
        self.broken: str | None = None
        timeout = timedelta(seconds=spec.timeout_seconds)
        try:
            self._store = dist.TCPStore(
                spec.master_address,
                spec.master_port,
                spec.world_size,
                is_master=rank == 0,
                timeout=timeout,
                wait_for_workers=False,
            )
            device = "cuda" if spec.backend == "nccl" else "cpu"
            store = dist.PrefixStore(
                f"{device}/",
                dist.PrefixStore(f"{spec.group_name}/", dist.PrefixStore(spec.group_name, self._store)),
            )
            self._pg = self._backend(store, rank, spec, timeout)
        except (RuntimeError, ValueError) as exc:  # c10d raises RuntimeError subclasses (DistStoreError, ...)
            self.destroy()
            raise WeightGroupError(
                f"weight group {spec.group_name!r} at {spec.master_address}:{spec.master_port} "
                f"(rank {rank} of {spec.world_size}) could not be formed: {exc}"
            ) from None

    @staticmethod
    def _backend(store, rank: int, spec: GroupSpec, timeout: timedelta):
        if spec.backend == "gloo":
            return dist.ProcessGroupGloo(store, rank, spec.world_size, timeout)
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
        return self._pg.broadcast([tensor], options)

    def exchange_status(self, code: int) -> list[int]:
        """Every member contributes one status code; every member gets all of them, by rank.

        The end-of-update acknowledgement: the sender learns whether each receiver verified."""
        if self.broken:
            raise WeightGroupError(f"weight group {self.spec.group_name!r} is broken: {self.broken}")
        mine = torch.tensor([code], dtype=torch.int64, device=self.device)
        gathered = [torch.zeros_like(mine) for _ in range(self.spec.world_size)]
        try:
            self._pg.allgather([gathered], [mine]).wait()
        except RuntimeError as exc:
            self.mark_broken(str(exc))
            raise WeightGroupError(f"status exchange failed: {str(exc).splitlines()[0]}") from None
        return [int(t.item()) for t in gathered]

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
        self._store = None
        self.broken = self.broken or "destroyed"


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
