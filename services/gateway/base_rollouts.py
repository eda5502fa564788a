"""One rollout service per base model, shared by every sampler of that base: each sample call
names the weights it needs (an export's directory, or the base model's own), and the service
switches to them before generating.

    sampler A (export v1) --\\                     +---------------------------------------+
    sampler B (export v2) ---> BaseRollout.thread: | loaded != wanted? UpdateWeights (disk)  |
    sampler C (base)     --/   (one call at a time)| Generate                              |
                                                   +---------------------------------------+

Calls run one at a time on the rollout's own thread, so a Generate always runs on the weights
its sampler names, never on another export's; a switch costs one disk weight update (reading
the export's files into the live engine), not a process start. The service starts on the first
call and stops when its base has no samplers left or none sampled for --sampler-idle-s (the next
call starts it again).
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rollway.common.client import open_channel
from rollway.common.log import get_logger
from rollway.common.supervision.supervisor import LocalServiceGroup
from rollway.common.v1 import common_pb2
from rollway.gateway.config import GatewayConfig
from rollway.gateway.sampler_weights import prepare_update
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

log = get_logger("rollway.gateway.rollouts")


def _key(path: Path) -> str:
    return hashlib.sha1(str(path).encode()).hexdigest()[:12]


class BaseRollout:
    """The rollout service of one base model and the weights it serves now."""

    def __init__(self, base_model: Path, workdir: Path, config: GatewayConfig):
        """`workdir`: where the gateway's rollout services keep their logs and prepared updates."""
        self.base_model = base_model
        self.workdir = workdir / f"{base_model.name}-{_key(base_model)}"
        self.config = config
        self.group: LocalServiceGroup | None = None  # while the service runs
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"rollout-{base_model.name}")
        self.num_samplers = 0  # open samplers on this base (SamplingSessionTable's lock guards it)
        self.last_used = time.monotonic()
        self.stub: rollout_pb2_grpc.RolloutServiceStub | None = None
        self._channel = None
        self._loaded: Path | None = base_model  # the weights the engine serves (None: unknown)
        self._version = 0  # the engine's weight version: each switch commits the next one
        self._updates: dict[Path, common_pb2.WeightManifest] = {}  # prepared disk updates by weights dir
        self._lock = threading.Lock()

    # --- calls (on the rollout's thread) ----------------------------------------------------
    def submit(self, fn: Callable[[], Any]) -> Future:
        self.last_used = time.monotonic()
        return self.executor.submit(fn)

    def generate(
        self, weights: Path, request: rollout_pb2.GenerateRequest
    ) -> list[rollout_pb2.GenerateResponse]:
        """Generate on `weights` (switching to them first); the replies in sample index order."""
        stub = self._serve(weights)
        replies = sorted(stub.Generate(request), key=lambda reply: reply.sample.index)
        self.last_used = time.monotonic()
        return replies

    def _serve(self, weights: Path) -> rollout_pb2_grpc.RolloutServiceStub:
        if self.group is None or self.group.dead() is not None:
            self._start()
        if weights != self._loaded:
            self._switch(weights)
        return self.stub

    def _start(self) -> None:
        self._shut()
        tick = time.perf_counter()
        args = ["--hf-checkpoint", str(self.base_model), "--dtype", self.config.dtype, "--reward", "none"]
        self.group = LocalServiceGroup(self.workdir / "service", args={"rollout": args},
                                       startup_timeout=self.config.startup_timeout_s)  # fmt: skip
        self.group.start({"rollout": 1})
        self._channel = open_channel(self.group.addresses["rollout"][0])
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)
        self.stub.Init(rollout_pb2.InitRequest(run_id=f"sampler-{_key(self.base_model)}"), timeout=60)
        self._loaded, self._version = self.base_model, 0
        log.info("rollout service started", base_model=str(self.base_model),
                 seconds=round(time.perf_counter() - tick, 3))  # fmt: skip

    def prepare(self, weights: Path) -> common_pb2.WeightManifest:
        """The disk update of `weights`, written once (the gateway asks for it when a sampler
        opens, so the first sample only loads it; the hard links keep an export's files readable
        even if its checkpoint is deleted meanwhile)."""
        with self._lock:
            update = self._updates.get(weights)
        if update is None:
            update = prepare_update(weights, self.config.dtype, self.workdir / "updates" / _key(weights))
            with self._lock:
                self._updates[weights] = update
        return update

    def _switch(self, weights: Path) -> None:
        tick = time.perf_counter()
        update = self.prepare(weights)
        manifest = common_pb2.WeightManifest()
        manifest.CopyFrom(update)
        # A failed call may or may not have committed: the served weights are unknown until the next
        # switch, whose version is new either way (a reused one would be dropped as already applied).
        self._loaded = None
        self._version += 1
        manifest.weight_version = self._version
        request = rollout_pb2.UpdateWeightsRequest(manifest=manifest)
        self.stub.UpdateWeights(request, timeout=self.config.startup_timeout_s)  # at most a model load
        self._loaded = weights
        log.info("sampler weights loaded", weights=str(weights), weight_version=self._version,
                 seconds=round(time.perf_counter() - tick, 3))  # fmt: skip

    def _disconnect(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self.stub = None

    def _shut(self) -> None:
        self._disconnect()
        group, self.group = self.group, None
        if group is not None:
            group.stop()

    # --- lifetime (from the gateway) --------------------------------------------------------
    def forget(self, weights: Path) -> None:
        """Drop the prepared update of weights no sampler uses any more (its files too)."""
        with self._lock:
            dropped = self._updates.pop(weights, None)
        if dropped is not None:
            shutil.rmtree(dropped.disk_path, ignore_errors=True)

    def stop_when_idle(self, idle_s: float) -> None:
        """Stop the service (on its thread, after the calls queued before) if unused for `idle_s`."""

        def idle() -> bool:
            return self.group is not None and time.monotonic() - self.last_used >= idle_s

        def stop() -> None:
            if idle():  # still: no call came meanwhile
                log.info("rollout service idle; stopping it", base_model=str(self.base_model))
                self._shut()

        if idle():
            self.executor.submit(stop)

    def close(self) -> None:
        """Stop the service and the thread (queued calls are dropped)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._shut()
        shutil.rmtree(self.workdir / "updates", ignore_errors=True)
