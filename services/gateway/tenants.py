"""Models and the trainer services that train them. A full fine-tuning model has a trainer of
its own (a ServiceGroup of its own: a local process, or a Ray actor with --launcher ray); LoRA
models of one base model share one trainer (the base weights once in memory), each as a named
adapter of it with its own adapters, optimizer state and gradients (trainer/lora_tenants.py).
Each model's calls run on its own thread in order; the trainer serialises the calls of the
models it trains, so tenants never mix.

A trainer that dies is started again and every model it trained is loaded from that model's last
saved state (or the base model when it saved none); the call that was in flight fails with
TrainerRestarted, saying so. Models on other trainers never notice.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from rollway.common.client import open_channel
from rollway.common.log import get_logger
from rollway.common.supervision.supervisor import LocalServiceGroup, ServiceGroup
from rollway.gateway.checkpoints import SavedCheckpoint, TenantSpec
from rollway.gateway.config import GatewayConfig
from rollway.gateway.errors import TrainerRestarted
from rollway.trainer.v1 import trainer_pb2, trainer_pb2_grpc

log = get_logger("rollway.gateway")


def trainer_group(spec: TenantSpec, name: str, workdir: Path, config: GatewayConfig) -> ServiceGroup:
    """The ServiceGroup that starts, watches and restarts a trainer (one rank) of `spec`'s base
    model; `name`: the model id, or a shared trainer's name (its Ray actor's name)."""
    if config.launcher == "ray":
        # The coordinator's Ray launcher, as for a run: it reads each service's settings, here
        # only the trainer's model settings given.
        from rollway.common.supervision.placement import ServiceSettings
        from rollway.common.supervision.ray_services import RayServiceGroup
        from rollway.coordinator.config import CoordinatorConfig
        from rollway.dataloader.config import DataloaderConfig
        from rollway.rollout.config import RolloutConfig
        from rollway.trainer.config import TrainerConfig

        trainer = TrainerConfig(
            hf_checkpoint=spec.base_model, world_size=1, dtype=config.dtype, lora_rank=spec.lora_rank
        )
        run = ServiceSettings(
            coordinator=CoordinatorConfig(launcher="ray", ray_address=config.ray_address),
            trainer=trainer,
            rollout=RolloutConfig(),
            dataloader=DataloaderConfig(),
        )
        return RayServiceGroup(run, workdir, name=name, ray_address=config.ray_address)
    args = ["--hf-checkpoint", spec.base_model, "--world-size", "1", "--dtype", config.dtype]
    if spec.lora_rank:
        args += ["--lora-rank", str(spec.lora_rank)]
    return LocalServiceGroup(workdir, args={"trainer": args}, startup_timeout=config.startup_timeout_s)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Trainer:
    """One trainer service and the models it trains (one, or several LoRA tenants of one base)."""

    def __init__(
        self, spec: TenantSpec, run_id: str, workdir: Path, config: GatewayConfig, base_bytes: int = 0
    ):
        self.run_id = run_id
        self.group = trainer_group(spec, run_id, workdir, config)
        self.base_bytes = base_bytes  # a shared trainer's base model (its tenants count only their adapters)
        self.tenants: dict[str, Tenant] = {}  # adapter name ("" for a trainer of one model) -> model
        self.num_restarts = 0
        self.stub: trainer_pb2_grpc.TrainerServiceStub | None = None
        self._channel: grpc.Channel | None = None
        self._lock = threading.RLock()
        self._started = False

    def start(self) -> None:
        """Start the trainer and initialise its run (blocks while the model loads); once."""
        with self._lock:
            if not self._started:
                self.group.start({"trainer": 1})
                self._connect()
                self._started = True

    def _connect(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = open_channel(self.group.addresses["trainer"][0])
        self.stub = trainer_pb2_grpc.TrainerServiceStub(self._channel)
        self.stub.Init(trainer_pb2.InitRequest(run_id=self.run_id))

    def heal(self) -> bool:
        """If the trainer died: start a new one and load each model's last saved state; True if it did."""
        with self._lock:
            if not self._started or self.group.dead() is None:
                return False
            self.group.restart("trainer", 0)
            self._connect()
            for adapter, tenant in list(self.tenants.items()):
                if tenant.last_state is not None:
                    self.stub.LoadCheckpoint(
                        trainer_pb2.LoadCheckpointRequest(
                            path=str(tenant.last_state.directory), adapter=adapter
                        )
                    )
            self.num_restarts += 1
            return True

    def leave(self, adapter: str) -> None:
        """A model released: forget its adapters, or stop the trainer when it trained no other."""
        with self._lock:
            self.tenants.pop(adapter, None)
            if not self.tenants:
                self.stop()
                return
            if self._started and self.group.dead() is None:
                try:
                    self.stub.DropAdapter(trainer_pb2.DropAdapterRequest(adapter=adapter), timeout=30)
                except grpc.RpcError as exc:  # a dying trainer forgets it anyway
                    log.warning("could not drop a released model's adapters", adapter=adapter, error=str(exc))

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self.group.stop()


class Tenant:
    """A model being trained: its trainer (and adapter name on a shared one), ordered calls,
    checkpoints."""

    def __init__(self, spec: TenantSpec, workdir: Path, trainer: Trainer, adapter: str = ""):
        self.spec = spec
        self.workdir = workdir
        self.checkpoint_root = workdir / "checkpoints"
        self.trainer = trainer
        self.adapter = adapter  # its name on a shared trainer ("": the trainer is its own)
        trainer.tenants[adapter] = self
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"tenant-{spec.model_id}")
        self.last_state: SavedCheckpoint | None = None  # what a restarted trainer loads
        self.last_request_time = datetime.now(UTC)

    # --- life ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the trainer (a shared one only for the first of its models)."""
        self.trainer.start()

    def heal(self) -> bool:
        return self.trainer.heal()

    def stop(self) -> None:
        """Release the model (queued calls are dropped) and what only it used of its trainer."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.trainer.leave(self.adapter)

    # --- calls -----------------------------------------------------------------------------
    def call(self, fn: Callable[[trainer_pb2_grpc.TrainerServiceStub], Any]) -> Any:
        """Run `fn` against the trainer (requests name `self.adapter`); a trainer found dead
        meanwhile is healed and the call fails with TrainerRestarted (its work is lost: the client
        repeats it)."""
        self.last_request_time = datetime.now(UTC)
        trainer = self.trainer
        restarts = trainer.num_restarts
        try:
            return fn(trainer.stub)
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION):
                raise
            # UNAVAILABLE: the process may still be exiting, wait for it a little. A refusal
            # (FAILED_PRECONDITION) is about the request unless the trainer is dead already.
            patience = 5.0 if exc.code() == grpc.StatusCode.UNAVAILABLE else 0.0
            deadline = time.monotonic() + patience
            while (
                trainer.group.dead() is None
                and trainer.num_restarts == restarts
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            # The gateway's watch may have healed it first.
            if not trainer.heal() and trainer.num_restarts == restarts:
                raise
            raise TrainerRestarted(self.spec.model_id, self.last_state) from None

    def save(self, root: Path, tinker_path: str, kind: str) -> SavedCheckpoint:
        """Save the current weights (and optimizer) into `root`, replacing what is there."""
        if root.exists():
            shutil.rmtree(root)
        request = trainer_pb2.SaveCheckpointRequest(path=str(root), hf_export=True, adapter=self.adapter)
        reply = self.call(lambda t: t.SaveCheckpoint(request))
        return SavedCheckpoint(
            tinker_path=tinker_path,
            kind=kind,
            directory=Path(reply.checkpoint_dir),
            hf_dir=Path(reply.hf_dir),
            time=datetime.now(UTC),
            size_bytes=_size(root),
            root=root,
        )
