"""The actors of one run on Ray: placed together, started in order, watched, stopped.

create()          placement group (one bundle per ActorSpec, PACK) -> one ServiceHost per bundle
start_services()  trainer-0 (gRPC + rank 0's store) -> trainer-1.. join it; rollout-i, dataloader
                  -> addresses "<node ip>:<port>" -> wait until each is SERVING
start_coordinator(), RaySupervisor (actor or process death), shutdown() (by pid, then the actors)
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

from rollway.common.client import wait_until_serving
from rollway.common.config import to_dict
from rollway.deploy.placement import ActorSpec
from rollway.deploy.ray_actors import ServiceHost
from rollway.launcher import non_default_settings

PLACEMENT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 600.0
STOP_ORDER = ("coordinator", "dataloader", "rollout", "trainer")  # rank 0 tells its workers to stop
# Settings taken from the driver's environment into every actor's (a node's `ray start` may lack them).
FORWARDED_ENV = (
    "ROLLWAY_AUTH_TOKEN",
    "ROLLWAY_TLS_CA",
    "ROLLWAY_TLS_CERT",
    "ROLLWAY_TLS_KEY",
    "ROLLWAY_TLS_SERVER_NAME",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)


def forwarded_env() -> dict[str, str]:
    """The driver's FORWARDED_ENV variables that are set."""
    return {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}


def describe_dead(name: str, actor, node_ip: str) -> str | None:
    """How `name`'s actor or process ended, or None while both run."""
    import ray

    try:
        status = ray.get(actor.poll.remote(), timeout=30)
    except ray.exceptions.RayActorError as exc:
        reason = str(exc).strip().splitlines()[0][:300]
        return f"{name} (Ray actor on node {node_ip}) died; its service is gone. Ray says: {reason}"
    except ray.exceptions.GetTimeoutError:
        return None
    if status is None:
        return None
    return (
        f"{name} (pid {status['pid']} on node {node_ip}) exited with {status['code']}; "
        f"last log lines:\n{status['log_tail']}"
    )


class RayServices:
    """The placement group, the actors and what they report (node, pid, address)."""

    def __init__(self, specs: list[ActorSpec], run_id: str, workdir: Path):
        self.specs, self.run_id, self.workdir = specs, run_id, workdir
        self.actors: dict[str, object] = {}
        self.nodes: dict[str, dict] = {}
        self.group = None
        self.weight_port = 0

    def create(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.group = placement_group([s.resources for s in self.specs], strategy="PACK")
        ready, _ = ray.wait([self.group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise TimeoutError(
                f"the placement group was not placed within {PLACEMENT_TIMEOUT_S:.0f}s: it needs "
                f"{[s.resources for s in self.specs]}; the cluster has {ray.available_resources()}"
            )
        host_cls = ray.remote(ServiceHost)
        runtime_env = {"env_vars": forwarded_env()}
        for i, spec in enumerate(self.specs):
            strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i)
            self.actors[spec.name] = host_cls.options(
                name=f"rollway-{self.run_id}-{spec.name}",
                num_cpus=spec.resources.get("CPU", 0.0),
                num_gpus=spec.resources.get("GPU", 0.0),
                scheduling_strategy=strategy,
                runtime_env=runtime_env,
            ).remote(spec.name, str(self.workdir))
        names = list(self.actors)
        self.nodes = dict(zip(names, ray.get([self.actors[n].node.remote() for n in names]), strict=True))

    def start_services(self, configs: dict) -> dict[str, str | list[str]]:
        """Trainer ranks, rollout engines and the dataloader; their addresses once all are SERVING."""
        import ray

        pids = self._start_processes(configs)
        addresses: dict[str, str | list[str]] = {}
        for spec in self.specs:
            if spec.name not in pids:
                continue
            if spec.is_trainer_worker:
                print(f"  {spec.name:<14} rank {spec.index}  pid {pids[spec.name]}", flush=True)
                continue
            port = ray.get(self.actors[spec.name].wait_port.remote(START_TIMEOUT_S))
            address = f"{self.nodes[spec.name]['ip']}:{port}"
            print(f"  {spec.name:<14} {address}  pid {pids[spec.name]}", flush=True)
            if spec.service == "rollout":
                addresses.setdefault("rollout", []).append(address)
            else:
                addresses[spec.service] = address
        for address in [addresses.get("trainer"), addresses.get("dataloader"), *addresses.get("rollout", [])]:
            if address:
                self._wait_serving(address)  # the trainer: once every rank has loaded its shard
        return addresses

    def _start_processes(self, configs: dict) -> dict[str, int]:
        import ray

        started: dict[str, object] = {}  # actor name -> pid (a Ray future)
        trainer = None
        if "trainer-0" in self.actors:
            trainer = self._trainer_settings(configs["trainer"])
            started["trainer-0"] = self._start("trainer-0", "trainer", non_default_settings(trainer))
            ray.get(self.actors["trainer-0"].wait_port.remote(START_TIMEOUT_S))  # its store listens now
        for spec in self.specs:
            actor = self.actors[spec.name]
            if spec.is_trainer_worker:
                args = (
                    spec.index,
                    trainer.world_size,
                    trainer.master_addr,
                    trainer.master_port,
                    to_dict(trainer),
                )
                started[spec.name] = actor.start_trainer_worker.remote(*args)
            elif spec.service == "rollout":
                settings = non_default_settings(self._rollout_settings(configs["rollout"], spec))
                started[spec.name] = self._start(spec.name, "rollout", settings)
            elif spec.service == "dataloader":
                started[spec.name] = self._start(
                    spec.name, "dataloader", non_default_settings(configs["dataloader"])
                )
        return dict(zip(started, ray.get(list(started.values())), strict=True))

    def _wait_serving(self, address: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait for SERVING, failing at once if any started process or actor died meanwhile."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return wait_until_serving(address, 5.0)
            except TimeoutError:
                dead = self.first_dead()
                if dead:
                    raise RuntimeError(dead) from None
                if time.monotonic() > deadline:
                    raise

    def first_dead(self) -> str | None:
        for name, actor in self.actors.items():
            dead = describe_dead(name, actor, self.nodes[name]["ip"])
            if dead:
                return dead
        return None

    def start_coordinator(self, runs_root: Path) -> str:
        import ray

        pid = ray.get(self._start("coordinator", "coordinator", {}, ["--runs-root", str(runs_root)]))
        port = ray.get(self.actors["coordinator"].wait_port.remote(120.0))
        address = f"{self.nodes['coordinator']['ip']}:{port}"
        print(f"  {'coordinator':<14} {address}  pid {pid}", flush=True)
        self._wait_serving(address, 120.0)
        return address

    def _start(self, name: str, service: str, settings: dict, extra_args: list[str] = ()):
        return self.actors[name].start_service.remote(
            service, self.nodes[name]["ip"], settings, list(extra_args)
        )

    def _trainer_settings(self, trainer):
        """Rank 0 hosts the store on its node; ranks 1.. are actors of their own (spawn_workers false)."""
        import ray

        master_port, self.weight_port = ray.get(self.actors["trainer-0"].free_ports.remote(2))
        if trainer.world_size == 1:
            return trainer
        ip = self.nodes["trainer-0"]["ip"]
        return dataclasses.replace(trainer, spawn_workers=False, master_addr=ip, master_port=master_port)

    def _rollout_settings(self, rollout, spec: ActorSpec):
        """One engine per rollout service; a launched SGLang server binds this node on a free port."""
        import ray

        per_engine = rollout.rollout_num_gpus_per_engine
        if rollout.rollout_engine != "sglang" or rollout.sglang_urls:
            return dataclasses.replace(rollout, rollout_num_gpus=per_engine)
        (port,) = ray.get(self.actors[spec.name].free_ports.remote(1))
        host = self.nodes[spec.name]["ip"]
        return dataclasses.replace(rollout, rollout_num_gpus=per_engine, sglang_host=host, sglang_port=port)

    def run_overrides(self, c) -> dict:
        """The weight group's port on trainer rank 0's node (unless the config sets one)."""
        if self.weight_port and not c.update_weight_master_port:
            return {"update_weight_master_port": self.weight_port}
        return {}

    def shutdown(self) -> None:
        """Stop every process by pid (coordinator first, trainer rank 0 before its workers), then the actors."""
        import ray

        for name in sorted(self.actors, key=lambda n: STOP_ORDER.index(n.split("-")[0])):
            try:
                ray.get(self.actors[name].stop.remote(), timeout=60)
            except Exception:  # a dead actor took its process with it (PR_SET_PDEATHSIG)
                pass
        for actor in self.actors.values():
            ray.kill(actor)
        if self.group is not None:
            ray.util.remove_placement_group(self.group)


class RaySupervisor:
    """Watches the actors and their processes; `failure` describes the first that died."""

    def __init__(self, services: RayServices, interval_s: float = 1.0):
        self.services = services
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(interval_s,), daemon=True)
        self._thread.start()

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s) and self.check() is None:
            pass

    def check(self) -> str | None:
        """The first dead actor or process, described (None while all live); the launcher's interface."""
        if self.failure is None:
            self.failure = self.services.first_dead()
        return self.failure

    def close(self) -> None:
        self._stop.set()
