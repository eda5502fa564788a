"""Ray as a ServiceGroup: the services a run starts, as Ray actors placed together, watched,
restarted and stopped by the coordinator (run config `launcher: ray`, `ray_address`).

    coordinator (run thread)                 Ray cluster (one placement group, ray_placement_strategy)
    RayServiceGroup(run, workdir, name)
      .start(counts) ─ join Ray (or start a local instance) ─ plan_actors ─> one bundle and one
                       ServiceHost actor per process:
                         trainer-0 (gRPC, rank 0's store) <── trainer-1..N-1 (rollway.trainer.worker)
                         rollout-0.. (one per engine), dataloader
                     <─ addresses "<node ip>:<port>" once each is SERVING
      .placement_settings()  the weight group meets on trainer-0's node; the ranks' store there;
                             one engine per rollout service
      .dead()                an actor gone (node lost, OOM kill, ray stop) or its process exited;
                             an actor that does not answer is `unreachable`, not dead, until Ray's
                             verdict on its node (a partition that heals costs nothing)
      .restart(name, i)      a new actor in the same bundle, same settings, new address: on the
                             same node if it still answers; else after Ray's verdict, where Ray
                             re-placed the bundle (never back onto the lost node), or NoRoom at
                             once. The trainer's ranks are restarted together (torchelastic's rule)
      .stop()                every process by pid (rank 0 before its workers), the actors, the
                             placement group, and Ray where this process joined it

Each actor's process is its child and dies with it (ray_actors.py). Logs and settings of each
process: WORKDIR/<actor>/; where each actor runs: WORKDIR/ray.json.

This module orchestrates the group; its parts live beside it: one actor's record, creation and
stop (ray_group_actor.py), the polls behind dead() / unreachable() (ray_actor_watch.py), and this
process's Ray connection that concurrent runs share (ray_connection.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rollway.common.client import wait_until_serving
from rollway.common.config import non_default_settings, to_dict
from rollway.common.log import get_logger
from rollway.common.manifest import atomic_write_text
from rollway.common.supervision import ray_nodes
from rollway.common.supervision.cluster_layout import check_cluster, layout_text
from rollway.common.supervision.placement import (
    ActorSpec,
    PlacementError,
    PlacementSettings,
    ServiceSettings,
    check_fits,
    plan_actors,
)
from rollway.common.supervision.ray_actor_watch import UNREACHABLE_S, ActorWatch
from rollway.common.supervision.ray_connection import RayStartError, join_ray, leave_ray
from rollway.common.supervision.ray_group_actor import (
    GroupActor,
    actor_name,
    excerpt,
    new_actor,
    stop_actor,
    wait_name_free,
)
from rollway.common.supervision.supervisor import DeadService, ReplacementDied, ServiceGroup

log = get_logger("rollway.common.supervision.ray")

PLACEMENT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 30.0  # an actor method that does not answer in this long is taken as hung
RESTART_STOP_S = 5.0  # a restart's drain of the survivors it replaces (the run resumes from a checkpoint)
STOP_ORDER = ("dataloader", "rollout", "trainer")  # trainer rank 0 tells its workers to stop


class RayServiceGroup(ServiceGroup):
    """A run's services as Ray actors. `run`: each service's settings (a ServiceSettings, or the
    parsed run config); `name`: the run id, which names the actors (`rollway-<name>-<actor>`)."""

    def __init__(self, run: ServiceSettings, workdir: Path, *, name: str, ray_address: str = ""):
        self.run, self.workdir, self.name, self.ray_address = run, Path(workdir), name, ray_address
        self.addresses: dict[str, list[str]] = {}
        self.actors: dict[str, GroupActor] = {}
        self._launch: dict[str, tuple] = {}  # actor name -> how its process was started (restarts)
        self._placement: dict[str, object] = {}
        self._pg = None
        self._joined = self._stopped = False
        self._lock = threading.RLock()
        self._watch = ActorWatch()
        c = run.coordinator
        # Where the weight group meets, as the user gave it (else on trainer rank 0's node, and
        # placed again when rank 0 moves).
        self._given_weight_master = (c.update_weight_master_addr, c.update_weight_master_port)

    # --- start ---
    def start(self, counts: dict[str, int]) -> dict[str, list[str]]:
        """Start the services named in `counts`; the placement decides how many of each (one
        rollout service per engine, one actor per trainer rank)."""
        import ray

        configs = {"trainer": self.run.trainer, "rollout": self.run.rollout}
        services = list(counts)
        settings = PlacementSettings.from_config(self.run.coordinator)
        self._strategy = settings.strategy
        try:
            upper = plan_actors(configs, services, float("inf"), settings)
            join_ray(self.ray_address, math.ceil(sum(s.resources.get("CPU", 0.0) for s in upper)))
            self._joined = True
            specs = plan_actors(configs, services, ray.cluster_resources().get("GPU", 0.0), settings)
            check_fits(specs, ray.cluster_resources())
            nodes = ray_nodes.live_nodes()
            check_cluster(specs, settings.strategy, nodes)
        except PlacementError as exc:
            self.stop()
            raise RayStartError(f"cannot place the run on Ray: {exc}") from None
        except BaseException:
            self.stop()
            raise
        # Where each actor would go and which node's loss the run would not survive (an estimate).
        log.info(
            "placing the run on Ray",
            num_actors=len(specs),
            actors=layout_text(specs, settings.strategy, nodes),
        )
        try:
            self._create(specs)
            self._start_processes()
            self._wait_all_serving()
        except ray.exceptions.RayTaskError as exc:  # an actor method's own error, without Ray's frames
            self.stop()
            raise RayStartError(f"could not start on Ray: {exc.cause or exc}") from None
        except BaseException:
            self.stop()
            raise
        self._write_actors()
        return self.addresses

    def _create(self, specs: list[ActorSpec]) -> None:
        import ray
        from ray.util.placement_group import placement_group

        self._pg = placement_group([s.resources for s in specs], strategy=self._strategy)
        ready, _ = ray.wait([self._pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise RayStartError(
                f"the placement group was not placed within {PLACEMENT_TIMEOUT_S:.0f}s: it needs "
                f"{[s.resources for s in specs]}; the cluster has {ray.available_resources()}"
            )
        handles = [new_actor(self.name, spec, self.workdir, self._pg, i, 0) for i, spec in enumerate(specs)]
        nodes = ray.get([h.node.remote() for h in handles], timeout=CALL_TIMEOUT_S)
        for i, (spec, handle, node) in enumerate(zip(specs, handles, nodes, strict=True)):
            self.actors[spec.name] = GroupActor(spec, i, handle, node)

    def _start_processes(self, names: list[str] | None = None) -> None:
        """Trainer rank 0 first (its store is where the other ranks meet), then everything else;
        `names`: only these actors (a restart), all by default."""
        import ray

        names = list(self.actors) if names is None else names
        trainer = self.run.trainer
        if "trainer-0" in names:
            trainer = self._trainer_settings(self.run.trainer)
            self._launch["trainer-0"] = ("trainer", non_default_settings(trainer))
            self._spawn("trainer-0")
            ray.get(self.actors["trainer-0"].handle.wait_port.remote(START_TIMEOUT_S))
        if "rollout" in {a.spec.service for a in self.actors.values()}:
            self._placement["rollout_num_gpus"] = self.run.rollout.rollout_num_gpus_per_engine
        for name in names:
            spec = self.actors[name].spec
            if spec.is_trainer_worker:
                args = (spec.index, trainer.world_size, trainer.master_addr, trainer.master_port)
                self._launch[name] = ("worker", (*args, to_dict(trainer)))
            elif spec.service == "rollout":
                self._launch[name] = (
                    "rollout",
                    non_default_settings(self._rollout_settings(self.actors[name])),
                )
            elif spec.service == "dataloader":
                self._launch[name] = ("dataloader", non_default_settings(self.run.dataloader))
            if name != "trainer-0":
                self._spawn(name)

    def _spawn(self, name: str) -> None:
        import ray

        actor = self.actors[name]
        kind, settings = self._launch[name]
        if kind == "worker":
            pid = actor.handle.start_trainer_worker.remote(*settings)
        else:
            pid = actor.handle.start_service.remote(kind, actor.node["ip"], settings, [])
        actor.pid = ray.get(pid, timeout=CALL_TIMEOUT_S)

    def _wait_all_serving(self) -> None:
        import ray

        for actor in self.actors.values():
            if not actor.spec.is_trainer_worker:
                port = ray.get(actor.handle.wait_port.remote(START_TIMEOUT_S))
                actor.address = f"{actor.node['ip']}:{port}"
        for actor in self.actors.values():
            log.info("Ray actor started", actor=actor.spec.name, node=actor.node["ip"], address=actor.address,
                     pid=actor.pid)  # fmt: skip
        with ThreadPoolExecutor(max(len(self.actors), 1)) as pool:  # the trainer: once every rank has loaded
            list(pool.map(self._wait_serving, [a.address for a in self.actors.values() if a.address]))
        self.addresses = {}
        for actor in self.actors.values():
            if actor.address:
                self.addresses.setdefault(actor.spec.service, []).append(actor.address)

    def _wait_serving(self, address: str, restarting: bool = False) -> None:
        """Wait for SERVING, failing at once if any actor or its process died meanwhile (a
        replacement that died while `restarting` is ReplacementDied: one more restart)."""

        def check() -> None:
            dead = self.dead()
            if dead is not None:
                raise ReplacementDied(dead) if restarting else RayStartError(f"{dead.name} {dead.detail}")

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                return wait_until_serving(address, 5.0)
            except TimeoutError:
                check()
                if time.monotonic() > deadline:
                    raise

    def _trainer_settings(self, trainer):
        """Rank 0 hosts the ranks' store and the weight group's on its node (ports picked there);
        ranks 1.. are actors of their own (spawn_workers false)."""
        import ray

        handle, ip = self.actors["trainer-0"].handle, self.actors["trainer-0"].node["ip"]
        master_port, weight_port = ray.get(handle.free_ports.remote(2), timeout=CALL_TIMEOUT_S)
        given_addr, given_port = self._given_weight_master
        if not given_addr:
            self._placement["update_weight_master_addr"] = ip
        if not given_port:
            self._placement["update_weight_master_port"] = weight_port
        if trainer.world_size == 1:
            return trainer
        placed = {"spawn_workers": False, "master_addr": ip, "master_port": master_port}
        self._placement.update(placed)
        return dataclasses.replace(trainer, **placed)

    def _rollout_settings(self, actor: GroupActor):
        """One engine per rollout service; a launched SGLang server binds this node on a free port."""
        import ray

        rollout = self.run.rollout
        per_engine = rollout.rollout_num_gpus_per_engine
        if rollout.rollout_engine != "sglang" or rollout.sglang_urls:
            return dataclasses.replace(rollout, rollout_num_gpus=per_engine)
        (port,) = ray.get(actor.handle.free_ports.remote(1), timeout=CALL_TIMEOUT_S)
        return dataclasses.replace(
            rollout, rollout_num_gpus=per_engine, sglang_host=actor.node["ip"], sglang_port=port
        )

    def placement_settings(self) -> dict[str, object]:
        return dict(self._placement)

    # --- supervision (the polls are ray_actor_watch's) ---
    def dead(self) -> DeadService | None:
        """The first actor found dead (Ray says so, or its process exited); never blocks on one
        that does not answer (see ActorWatch.dead)."""
        with self._lock:
            actors = list(self.actors.values())
        return self._watch.dead(actors)

    def rebuilt_by_restart(self) -> set[str]:
        return {"trainer"} if "trainer-1" in self.actors else set()

    def unreachable(self, name: str, index: int) -> str | None:
        return self._watch.unreachable(self._members(name, index))

    def settle(self, name: str, index: int) -> DeadService | None:
        """Ray may declare a node lost after a long cut even once its link is back: wait for that
        verdict (or for its window to pass) before a run goes on with the node's services."""
        return self._watch.settle(self._members(name, index), stopping=lambda: self._stopped)

    def verdict_pending_seconds(self) -> float:
        with self._lock:
            actors = list(self.actors.values())
        return self._watch.verdict_pending_seconds(actors)

    def _members(self, name: str, index: int) -> list[GroupActor]:
        """The actors of instance `index` of `name`: every rank for the trainer."""
        with self._lock:
            return [a for a in self.actors.values() if a.service_index == (name, index)]

    def restart(self, name: str, index: int) -> str:
        """New actors in place of the instance's (every trainer rank together), started with the
        same settings: on the same node where it still answers, else where Ray re-placed the
        bundle after its verdict on the lost node. NoRoom (CannotRestart) when no live node can
        host it; ReplacementDied when the new actor dies while it starts."""
        import ray

        members = self._members(name, index)
        for actor in sorted(members, key=lambda a: a.spec.index):  # rank 0 before its workers
            stop_actor(actor, RESTART_STOP_S)
        for actor in members:
            self._await_room(actor)
        with self._lock:
            for actor in members:
                wait_name_free(actor_name(self.name, actor.spec))
                actor.generation += 1
                actor.pid, actor.address, actor.poll = 0, "", None
                actor.handle = new_actor(
                    self.name, actor.spec, self.workdir, self._pg, actor.bundle, actor.generation
                )
        try:
            for actor in members:
                actor.node = ray.get(actor.handle.node.remote(), timeout=PLACEMENT_TIMEOUT_S)
            self._start_processes([a.spec.name for a in members])
            for actor in members:
                if not actor.spec.is_trainer_worker:
                    port = ray.get(actor.handle.wait_port.remote(START_TIMEOUT_S))
                    actor.address = f"{actor.node['ip']}:{port}"
        except ray.exceptions.RayActorError as exc:
            raise ReplacementDied(
                DeadService(
                    name, index, f"(its replacement) died while starting. Ray says: {excerpt(str(exc))}"
                )
            ) from None
        except ray.exceptions.RayTaskError as exc:
            raise RayStartError(f"could not restart on Ray: {exc.cause or exc}") from None
        address = next(a.address for a in members if a.address)
        self._wait_serving(address, restarting=True)
        for actor in members:
            log.info("Ray actor restarted", actor=actor.spec.name, node=actor.node["ip"], address=actor.address,
                     pid=actor.pid, generation=actor.generation)  # fmt: skip
        self.addresses[name][index] = address
        self._write_actors()
        return address

    def _await_room(self, actor: GroupActor) -> None:
        """Where the dead actor's node no longer answers, wait for Ray's verdict on it and for its
        bundle to be placed on a live node (Ray reschedules it), or fail naming what is missing."""
        node_id, ip = actor.node["id"], actor.node["ip"]
        if ray_nodes.node_answers(node_id):
            return  # the node lives (the actor or its process alone died): its bundle is still there
        log.warning("waiting for Ray's verdict on a node that does not answer", actor=actor.spec.name,
                    node=ip)  # fmt: skip
        if not ray_nodes.await_verdict(node_id, stopping=lambda: self._stopped):
            return  # it answers again: a partition that healed
        log.warning("Ray declared the node dead; waiting for its bundle to be placed elsewhere",
                    actor=actor.spec.name, node=ip)  # fmt: skip
        ray_nodes.await_bundle(
            self._pg, actor.bundle, actor.spec.resources, actor.spec.name, lost_node=ip,
            timeout_s=PLACEMENT_TIMEOUT_S,
        )  # fmt: skip

    def kill(self, name: str, index: int) -> None:
        """SIGKILL the hung service's process (every rank's, for the trainer): dead() then sees it."""
        import ray

        refs = [a.handle.kill.remote() for a in self._members(name, index)]
        ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)

    def _write_actors(self) -> None:
        """WORKDIR/ray.json: where each actor runs (node, address, pid, restarts) and the settings
        the placement decided."""
        actors = {
            name: {
                "service": a.spec.service,
                "index": a.spec.index,
                "node": a.node["ip"],
                "address": a.address,
                "pid": a.pid,
                "generation": a.generation,
            }
            for name, a in self.actors.items()
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Replaced whole: tools and tests polling it never read a file half written.
        atomic_write_text(
            self.workdir / "ray.json",
            json.dumps({"actors": actors, "placement_settings": self._placement}, indent=1),
        )

    # --- stop ---
    def stop(self) -> None:
        """Every process by pid (trainer rank 0 before its workers), the actors, the group, Ray."""
        import ray

        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            ordered = sorted(
                self.actors.values(), key=lambda a: (STOP_ORDER.index(a.spec.service), a.spec.index)
            )
        for actor in ordered:
            stop_actor(actor, 0.0 if self._watch.silent_seconds(actor) > UNREACHABLE_S else 60.0)
        try:
            if self._pg is not None:
                ray.util.remove_placement_group(self._pg)
        finally:
            if self._joined:
                leave_ray()
