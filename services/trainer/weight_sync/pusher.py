"""Rank 0's weight sync: the weight group, the pushed version, and the PushWeights sequence.

    InitWeightGroup(spec):  same spec as the live group -> no-op; otherwise destroy it, then form a
                            new group as rank 0 (hosting its TCPStore at master_port): the run's
                            DistributedSender, which owns the group and its buffers
    PushWeights(v):         check v -> the request's transport (registry.py: distributed.py,
                            disk.py) yields the manifest (the coordinator forwards it to the
                            receivers) and delivers the weights, running its steps on every rank
                            as WeightPass commands (passes.py) -> record v as pushed -> the timings

Versions only move forward: v below the last pushed version is refused; v equal to it re-sends
the same weights (a retry after some receiver failed) unless the model has trained since, in
which case the caller must push a new version. A failed broadcast destroys the group (every
receiver's collective fails at once), leaves the version unchanged and answers UNAVAILABLE; the
coordinator then rebuilds the group and retries. The trainer's own ranks stay in step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from rollway.common.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from rollway.common.log import get_logger
from rollway.common.v1 import common_pb2
from rollway.common.weight_sync.buckets import DEFAULT_BUCKET_SIZE_BYTES, check_chunk_bytes
from rollway.common.weight_sync.group import GroupSpec, WeightGroup, WeightGroupError
from rollway.common.weight_sync.transports import TRANSPORTS
from rollway.common.weights_checksum import dtype_from_name
from rollway.trainer.commands import WeightPass
from rollway.trainer.sharding import DTYPE_NAMES
from rollway.trainer.v1 import trainer_pb2
from rollway.trainer.weight_sync.base import OnRanks, Sender, SendResult
from rollway.trainer.weight_sync.distributed import DistributedSender
from rollway.trainer.weight_sync.passes import WeightStep
from rollway.trainer.weight_sync.registry import sender_kind

log = get_logger("rollway.trainer.weight_sync")


class WeightPusher:
    """The trainer's half of the weight-sync protocol (the servicer delegates to it)."""

    def __init__(self, controller, auth_token: str = ""):
        self.controller = controller
        self.auth_token = auth_token  # members of its weight groups prove a secret derived from it
        self.broadcaster: DistributedSender | None = None  # the run's, formed by InitWeightGroup
        self.pushed_at: tuple[int, int] | None = None  # (version, global_step) of the last push
        self._lock = threading.Lock()
        self._cancel_join = threading.Event()  # set by close(): the join in progress fails at once

    @property
    def group(self) -> WeightGroup | None:
        return self.broadcaster.group if self.broadcaster is not None else None

    # --- InitWeightGroup ------------------------------------------------------------------
    def init_group(self, spec_pb: common_pb2.WeightGroupSpec) -> bool:
        """Form the group as rank 0; True if an identical healthy group already exists."""
        try:
            spec = GroupSpec.from_proto(spec_pb)
        except ValueError as exc:
            field, _, problem = str(exc).partition(": ")
            raise InvalidArgument(field, problem) from None
        if spec.rank_offset != 0:
            raise InvalidArgument(
                "group.rank_offset", f"the trainer is always rank 0 (got {spec.rank_offset})"
            )
        with self._lock:
            if self.group is not None and not self.group.broken and self.group.spec == spec:
                return True
            self._cancel_join = cancel = threading.Event()
            self._leave()
            try:
                group = WeightGroup(spec, rank=0, cancel=cancel, auth_token=self.auth_token)
            except WeightGroupError as exc:
                # Not UNAVAILABLE: clients retry that, and a lone retry of a collective join cannot succeed.
                error = DeadlineExceeded if "timeout" in str(exc).lower() else FailedPrecondition
                raise error(str(exc)) from None
            self.broadcaster = DistributedSender(group)
        log.info(
            "weight group formed", group=spec.group_name, world_size=spec.world_size, backend=spec.backend
        )
        return False

    def close(self) -> None:
        """Destroy the group (if any); members blocked in a collective on it fail at once, and so
        does a join in progress here (the trainer stopping never waits for absent members)."""
        self._cancel_join.set()
        self._leave()

    def _leave(self) -> None:
        broadcaster, self.broadcaster = self.broadcaster, None
        if broadcaster is not None:
            broadcaster.close()

    # --- PushWeights ----------------------------------------------------------------------
    def _check_request(self, request: trainer_pb2.PushWeightsRequest) -> tuple[str, str, int]:
        if request.weight_version <= 0:
            raise InvalidArgument("weight_version", f"must be positive (got {request.weight_version})")
        transport = request.transport or "distributed"
        sender_kind(transport).check(request)
        problem = check_chunk_bytes(request.broadcast_chunk_bytes)
        if problem:
            raise InvalidArgument("broadcast_chunk_bytes", problem)
        if request.bucket_size_bytes < 0:
            raise InvalidArgument(
                "bucket_size_bytes", f"must not be negative (got {request.bucket_size_bytes})"
            )
        dtype = request.dtype or self.controller.startup.dtype
        if dtype not in DTYPE_NAMES:
            raise InvalidArgument("dtype", f"must be one of {', '.join(DTYPE_NAMES)} (got {dtype!r})")
        return transport, str(dtype_from_name(dtype)).removeprefix("torch."), request.bucket_size_bytes

    def _check_version(self, version: int) -> None:
        last = self.controller.weight_version
        if version < last:
            raise FailedPrecondition(
                f"weight_version: versions only move forward (last pushed {last}, got {version})"
            )
        step = self.controller.engine.global_step
        if version == last and self.pushed_at != (version, step):
            raise FailedPrecondition(
                f"weight_version: version {version} was pushed before the weights changed "
                f"(now at step {step}); push a new version"
            )

    def push(self, request: trainer_pb2.PushWeightsRequest) -> Iterator[trainer_pb2.PushWeightsResponse]:
        """PushWeights: the manifest first, the timings last (see the module doc)."""
        transport, dtype, bucket_size = self._check_request(request)
        bucket_size = bucket_size or DEFAULT_BUCKET_SIZE_BYTES
        version = request.weight_version
        started = time.perf_counter()
        with self._lock, self.controller.lock:
            self._check_version(version)
            sender = self._sender(transport)
            plan, sent = yield from sender.send(self._on_ranks(dtype, bucket_size), request)
            self.controller.weight_version = version
            self.pushed_at = (version, self.controller.engine.global_step)
        timings = common_pb2.WeightSyncTimings(
            gather_seconds=plan.gather_seconds + sent.gather_seconds,
            wire_seconds=sent.wire_seconds,
            verify_seconds=plan.checksum_seconds,
            total_seconds=time.perf_counter() - started,
            num_bytes=sent.num_bytes,
        )
        log.info("weights pushed", weight_version=version, transport=transport, num_bytes=sent.num_bytes,
                    seconds=round(timings.total_seconds, 3))  # fmt: skip
        yield trainer_pb2.PushWeightsResponse(timings=timings)

    def _sender(self, transport: str) -> Sender:
        """The run's sender of `transport`: the group's (formed by InitWeightGroup) for a transport
        that moves bytes on the weight group, a new one otherwise."""
        if not TRANSPORTS[transport].uses_group:
            return sender_kind(transport)()
        if self.broadcaster is None:
            raise FailedPrecondition("no weight group: call InitWeightGroup first")
        return self.broadcaster

    def _on_ranks(self, dtype: str, bucket_size: int) -> OnRanks:
        """Runs a step of this push on every trainer rank and returns rank 0's result. Rank 0 may
        get its own step (the broadcast's carries the group): its command is handed to its engine
        directly, never pickled."""

        def run(step: WeightStep, rank0_step: WeightStep | None = None) -> SendResult:
            workers = WeightPass(dtype, bucket_size, step)
            own = workers if rank0_step is None else WeightPass(dtype, bucket_size, rank0_step)
            return self.controller.runtime.run([own, *[workers] * (self.controller.world_size - 1)])

        return run
