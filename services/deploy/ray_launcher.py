"""`rollway run CONFIG --launcher ray [--ray-address ADDR]`: a run's services as Ray actors.

    driver (this process)                       Ray cluster (one placement group, PACK)
    plan_actors ─> bundles ─> actors:          trainer-0 .. trainer-{N-1}, rollout-i, dataloader, coordinator
    trainer-0: gRPC + rank 0's store (spawn_workers false) <── trainer-1..N-1: python -m rollway.trainer.worker
    addresses = actor node ip : port the service bound ──> StartRun on the coordinator actor
    follow StreamMetrics; RaySupervisor watches every actor and its process; stop all on exit

gRPC and weight sync are unchanged: the coordinator dials the services' addresses, and the weight
group meets at trainer rank 0's node on a port picked there (update_weight_master_port).
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from pathlib import Path

from rollway.common.client import wait_until_serving
from rollway.common.config import to_dict
from rollway.deploy.placement import ActorSpec, PlacementError, describe, plan_actors
from rollway.deploy.ray_actors import ServiceHost
from rollway.launcher import _drive, non_default_settings, run_settings, services_needed

PLACEMENT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 600.0


class RaySupervisor:
    """Watches the actors and their processes; `failure` names the first that died, and how."""

    def __init__(self, actors: dict[str, object], nodes: dict[str, dict], interval_s: float = 1.0):
        self.actors, self.nodes = actors, nodes
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(interval_s,), daemon=True)
        self._thread.start()

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s) and self.failure is None:
            self.failure = self.check()

    def check(self) -> str | None:
        """A description of the first dead actor or exited process, or None when all are well."""
        import ray

        for name, actor in self.actors.items():
            where = f"node {self.nodes[name]['ip']}"
            try:
                status = ray.get(actor.poll.remote(), timeout=30)
            except ray.exceptions.RayActorError as exc:
                reason = str(exc).strip().splitlines()[0][:300]
                return f"{name} (Ray actor on {where}) died; its service is gone. Ray says: {reason}"
            except ray.exceptions.GetTimeoutError:
                continue
            if status is not None:
                return (
                    f"{name} (pid {status['pid']} on {where}) exited with {status['code']}; "
                    f"last log lines:\n{status['log_tail']}"
                )
        return None

    def close(self) -> None:
        self._stop.set()


def run_on_ray(configs: dict, ray_address: str = "") -> int:
    """Place the run's services on Ray, drive the run, stop everything; the exit status."""
    import ray

    c = configs["coordinator"]
    from rollway.coordinator.runs import new_run_id

    run_id = c.run_id or new_run_id()
    run_dir = (Path(c.run_dir or "runs") / run_id).resolve()
    started_ray = not ray.is_initialized()
    try:
        if started_ray:
            _init_ray(ray_address, plan_actors(configs, services_needed(c), float("inf")))
        specs = plan_actors(configs, services_needed(c), ray.cluster_resources().get("GPU", 0.0))
        check_fits(specs, ray.cluster_resources())
    except PlacementError as exc:
        print(f"cannot place the run on Ray: {exc}", file=sys.stderr)
        return 2
    print(f"run {run_id}: {len(specs)} Ray actors\n{describe(specs)}", flush=True)
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    placement = _Placement(specs, run_id, run_dir / "services")
    try:
        placement.create()
        addresses = placement.start_services(configs)
        coordinator = placement.start_coordinator(run_dir.parent)
        supervisor = RaySupervisor(placement.actors, placement.nodes)
        settings = run_settings(c, run_id, str(run_dir.parent), addresses)
        settings.update(placement.run_overrides(c))
        code = _drive(coordinator, run_id, settings, c.num_rollout, supervisor, interrupted)
        supervisor.close()
        failure = supervisor.failure or (supervisor.check() if code else None)
        if code and failure and not supervisor.failure:
            print(f"service crashed: {failure}", file=sys.stderr, flush=True)
        return code
    except (RuntimeError, TimeoutError) as exc:
        print(f"run {run_id} could not start on Ray: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGINT, previous)
        placement.shutdown()
        if started_ray:
            ray.shutdown()


def _init_ray(address: str, specs: list[ActorSpec]) -> None:
    """Join the cluster at `address` (or RAY_ADDRESS); else start a local one that fits the run:
    its logical CPUs are at least one per actor, even on a 2-core laptop."""
    import os

    import ray

    address = address or os.environ.get("RAY_ADDRESS", "")
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        return
    num_cpus = max(os.cpu_count() or 1, int(sum(s.resources.get("CPU", 0.0) for s in specs)))
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def check_fits(specs: list[ActorSpec], cluster: dict[str, float]) -> None:
    """Refuse at once (rather than wait for placement) when the cluster is too small in total."""
    for resource in ("CPU", "GPU"):
        needed = sum(s.resources.get(resource, 0.0) for s in specs)
        if needed > cluster.get(resource, 0.0):
            raise PlacementError(
                f"the run's actors need {needed:g} {resource} in total and the Ray cluster has "
                f"{cluster.get(resource, 0.0):g}"
            )


class _Placement:
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
        for i, spec in enumerate(self.specs):
            self.actors[spec.name] = host_cls.options(
                name=f"rollway-{self.run_id}-{spec.name}",
                num_cpus=spec.resources.get("CPU", 0.0),
                num_gpus=spec.resources.get("GPU", 0.0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=i
                ),
            ).remote(spec.name, str(self.workdir))
        names = list(self.actors)
        self.nodes = dict(zip(names, ray.get([self.actors[n].node.remote() for n in names]), strict=True))

    def start_services(self, configs: dict) -> dict[str, str | list[str]]:
        """Trainer rank 0, its worker ranks, rollout engines and the dataloader; their addresses."""
        import ray

        started: dict[str, object] = {}  # actor name -> pid future
        trainer_settings = None
        if "trainer-0" in self.actors:
            trainer_settings = self._trainer_settings(configs["trainer"])
            started["trainer-0"] = self._start("trainer-0", "trainer", non_default_settings(trainer_settings))
            ray.get(self.actors["trainer-0"].wait_port.remote(START_TIMEOUT_S))  # its store listens now
        for spec in self.specs:
            if spec.is_trainer_worker:
                t = trainer_settings
                started[spec.name] = self.actors[spec.name].start_trainer_worker.remote(
                    spec.index, t.world_size, t.master_addr, t.master_port, to_dict(t)
                )
            elif spec.service == "rollout":
                settings = self._rollout_settings(configs["rollout"], spec)
                started[spec.name] = self._start(spec.name, "rollout", non_default_settings(settings))
            elif spec.service == "dataloader":
                started[spec.name] = self._start(
                    spec.name, "dataloader", non_default_settings(configs["dataloader"])
                )
        pids = dict(zip(started, ray.get(list(started.values())), strict=True))
        addresses: dict[str, str | list[str]] = {}
        for spec in self.specs:
            if spec.name not in pids or spec.is_trainer_worker:
                continue
            address = f"{self.nodes[spec.name]['ip']}:{ray.get(self.actors[spec.name].wait_port.remote(START_TIMEOUT_S))}"
            print(f"  {spec.name:<14} {address}  pid {pids[spec.name]}", flush=True)
            if spec.service == "rollout":
                addresses.setdefault("rollout", []).append(address)
            else:
                addresses[spec.service] = address
        for spec in self.specs:
            if spec.is_trainer_worker:
                print(f"  {spec.name:<14} rank {spec.index}  pid {pids[spec.name]}", flush=True)
        for address in [
            addresses.get("trainer", ""),
            addresses.get("dataloader", ""),
            *addresses.get("rollout", []),
        ]:
            if address:
                wait_until_serving(address, START_TIMEOUT_S)  # the trainer: once every rank has loaded
        return addresses

    def start_coordinator(self, runs_root: Path) -> str:
        import ray

        pid = ray.get(self._start("coordinator", "coordinator", {}, ["--runs-root", str(runs_root)]))
        address = (
            f"{self.nodes['coordinator']['ip']}:{ray.get(self.actors['coordinator'].wait_port.remote(120.0))}"
        )
        print(f"  {'coordinator':<14} {address}  pid {pid}", flush=True)
        wait_until_serving(address, 120.0)
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
        return dataclasses.replace(
            trainer, spawn_workers=False, master_addr=self.nodes["trainer-0"]["ip"], master_port=master_port
        )

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
        """Stop every process (coordinator first, trainer rank 0 before its workers), then the actors."""
        import ray

        order = sorted(
            self.actors,
            key=lambda n: ("coordinator", "dataloader", "rollout", "trainer").index(n.split("-")[0]),
        )
        for name in order:
            try:
                ray.get(self.actors[name].stop.remote(), timeout=60)
            except Exception:  # a dead actor took its process with it (PR_SET_PDEATHSIG)
                pass
        for actor in self.actors.values():
            ray.kill(actor)
        if self.group is not None:
            ray.util.remove_placement_group(self.group)
