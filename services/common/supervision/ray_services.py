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
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rollway.common.client import wait_until_serving
from rollway.common.config import non_default_settings, to_dict
from rollway.common.log import get_logger
from rollway.common.manifest import atomic_write_text
from rollway.common.process_exit import describe_exit
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
from rollway.common.supervision.ray_actors import ServiceHost
from rollway.common.supervision.ray_cluster import head_problem, join_failure_hint
from rollway.common.supervision.supervisor import DeadService, ReplacementDied, ServiceGroup

log = get_logger("rollway.common.supervision.ray")

PLACEMENT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 600.0
NAMESPACE = "rollway"  # actors are named rollway-<run id>-<actor> in it, whichever process placed them
CALL_TIMEOUT_S = 30.0  # an actor method that does not answer in this long is taken as hung
POLL_WAIT_S = 1.0  # how long one dead() waits for the actors' polls (the watch ticks on)
UNREACHABLE_S = 3.0  # a poll unanswered this long: the actor's node is cut off or lost
RESTART_STOP_S = 5.0  # a restart's drain of the survivors it replaces (the run resumes from a checkpoint)
RAY_SAYS_CHARS = 300
STOP_ORDER = ("dataloader", "rollout", "trainer")  # trainer rank 0 tells its workers to stop
# Settings taken from the coordinator's environment into every actor's (a node's `ray start` may lack them).
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


class RayStartError(RuntimeError):
    """The run's services could not be placed or started on Ray; the message says why."""


def forwarded_env() -> dict[str, str]:
    """The FORWARDED_ENV variables set in this process."""
    return {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}


@dataclass
class _Actor:
    """One actor of the group, and the process it hosts."""

    spec: ActorSpec
    bundle: int
    handle: object
    node: dict
    generation: int = 0
    pid: int = 0  # 0 until its process is started (a stop then only kills the actor)
    address: str = ""  # empty for trainer workers (no gRPC)
    poll: object = None  # the poll in flight (a Ray ObjectRef), sent at poll_sent
    poll_sent: float = 0.0
    quiet_since: float = 0.0  # when its current unreachable spell began (0: it answers)
    last_spell: tuple[float, float] | None = None  # (start, end) of its last unreachable spell

    @property
    def where(self) -> str:
        return f"Ray actor {self.spec.name} on node {self.node['ip']}"

    @property
    def service_index(self) -> tuple[str, int]:
        """The service it serves: a trainer rank is the trainer."""
        return self.spec.service, 0 if self.spec.service == "trainer" else self.spec.index


class RayServiceGroup(ServiceGroup):
    """A run's services as Ray actors. `run`: each service's settings (a ServiceSettings, or the
    parsed run config); `name`: the run id, which names the actors (`rollway-<name>-<actor>`)."""

    def __init__(self, run: ServiceSettings, workdir: Path, *, name: str, ray_address: str = ""):
        self.run, self.workdir, self.name, self.ray_address = run, Path(workdir), name, ray_address
        self.addresses: dict[str, list[str]] = {}
        self.actors: dict[str, _Actor] = {}
        self._launch: dict[str, tuple] = {}  # actor name -> how its process was started (restarts)
        self._placement: dict[str, object] = {}
        self._pg = None
        self._joined = self._stopped = False
        self._lock = threading.RLock()
        self._poll_lock = threading.Lock()
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
            _join_ray(self.ray_address, math.ceil(sum(s.resources.get("CPU", 0.0) for s in upper)))
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
        handles = [self._new_actor(spec, i, 0) for i, spec in enumerate(specs)]
        nodes = ray.get([h.node.remote() for h in handles], timeout=CALL_TIMEOUT_S)
        for i, (spec, handle, node) in enumerate(zip(specs, handles, nodes, strict=True)):
            self.actors[spec.name] = _Actor(spec, i, handle, node)

    def _new_actor(self, spec: ActorSpec, bundle: int, generation: int):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return (
            ray.remote(ServiceHost)
            .options(
                name=f"rollway-{self.name}-{spec.name}",
                namespace=NAMESPACE,
                num_cpus=spec.resources.get("CPU", 0.0),
                num_gpus=spec.resources.get("GPU", 0.0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=bundle
                ),
                runtime_env={"env_vars": forwarded_env()},
            )
            .remote(spec.name, str(self.workdir), generation)
        )

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

    def _rollout_settings(self, actor: _Actor):
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

    # --- supervision ---
    def dead(self) -> DeadService | None:
        """The first actor found dead (Ray says so, or its process exited). Each actor has one
        poll in flight at a time; one that does not come back is silence, judged by unreachable()
        and in the end by Ray's verdict on the node, never by this call blocking on it."""
        import ray

        with self._lock:
            actors = list(self.actors.values())
        with self._poll_lock:
            now = time.monotonic()
            for actor in actors:
                if actor.poll is not None and not actor.quiet_since and now - actor.poll_sent > UNREACHABLE_S:
                    actor.quiet_since = actor.poll_sent
                if actor.poll is None:
                    actor.poll, actor.poll_sent = actor.handle.poll.remote(), now
                elif now - actor.poll_sent > 4 * UNREACHABLE_S and ray_nodes.node_answers(actor.node["id"]):
                    actor.poll, actor.poll_sent = actor.handle.poll.remote(), now  # a healed partition
            polls = [(actor, actor.poll) for actor in actors]
        if not polls:
            return None
        ready, _ = ray.wait([poll for _, poll in polls], num_returns=len(polls), timeout=POLL_WAIT_S)
        answered = set(ready)
        for actor, poll in polls:
            if poll not in answered:
                continue
            with self._poll_lock:
                if actor.poll is poll:
                    actor.poll = None
                if actor.quiet_since:
                    actor.last_spell, actor.quiet_since = (actor.quiet_since, time.monotonic()), 0.0
            try:
                status = ray.get(poll)
            except ray.exceptions.RayActorError as exc:
                return DeadService(*actor.service_index, f"({actor.where}) died; its service is gone. "
                                   f"Ray says: {excerpt(str(exc))}")  # fmt: skip
            if status is not None:
                return DeadService(
                    *actor.service_index,
                    f"({actor.where}, pid {status['pid']}) {describe_exit(status['code'])}; "
                    f"last log lines:\n{status['log_tail']}",
                )
        return None

    def _silent_seconds(self, actor: _Actor) -> float:
        with self._poll_lock:
            return time.monotonic() - actor.poll_sent if actor.poll is not None else 0.0

    def rebuilt_by_restart(self) -> set[str]:
        return {"trainer"} if "trainer-1" in self.actors else set()

    def unreachable(self, name: str, index: int) -> str | None:
        for actor in self._members(name, index):
            silent = self._silent_seconds(actor)
            if silent > UNREACHABLE_S:
                return (
                    f"{actor.where} has not answered for {silent:.0f}s: its node is cut off or lost "
                    "(Ray's verdict on the node decides; a partition that heals costs no restart)"
                )
        return None

    def settle(self, name: str, index: int) -> DeadService | None:
        """Ray may declare a node lost after a long cut even once its link is back: wait for that
        verdict (or for its window to pass) before a run goes on with the node's services."""
        for actor in self._members(name, index):
            if actor.last_spell is None:
                continue
            (start, end), actor.last_spell = actor.last_spell, None
            if end - start < ray_nodes.long_spell_s():
                continue
            log.warning("waiting for Ray's verdict on a node that was cut off", actor=actor.spec.name,
                        node=actor.node["ip"], silent_seconds=round(end - start, 1))  # fmt: skip
            late_verdict_s = ray_nodes.late_verdict_s()
            while time.monotonic() < start + late_verdict_s and not self._stopped:
                if not ray_nodes.node_alive(actor.node["id"]):
                    return DeadService(*actor.service_index, f"({actor.where}) was lost: Ray declared its node "
                                       f"dead after it was cut off for {end - start:.0f}s")  # fmt: skip
                time.sleep(ray_nodes.POLL_S)
        return None

    def verdict_pending_seconds(self) -> float:
        with self._lock:
            actors = list(self.actors.values())
        silent = [self._silent_seconds(a) for a in actors]
        return max([0.0, *(ray_nodes.VERDICT_TIMEOUT_S - s for s in silent if s > UNREACHABLE_S)])

    def _members(self, name: str, index: int) -> list[_Actor]:
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
            _stop_actor(actor, RESTART_STOP_S)
        for actor in members:
            self._await_room(actor)
        with self._lock:
            for actor in members:
                _wait_name_free(f"rollway-{self.name}-{actor.spec.name}")
                actor.generation += 1
                actor.pid, actor.address, actor.poll = 0, "", None
                actor.handle = self._new_actor(actor.spec, actor.bundle, actor.generation)
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

    def _await_room(self, actor: _Actor) -> None:
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
            _stop_actor(actor, 0.0 if self._silent_seconds(actor) > UNREACHABLE_S else 60.0)
        try:
            if self._pg is not None:
                ray.util.remove_placement_group(self._pg)
        finally:
            if self._joined:
                _leave_ray()


def _stop_actor(actor: _Actor, drain_s: float) -> None:
    """Its process by pid (a drain of up to `drain_s`), then the actor; a dead actor took its
    process with it, and one that never started a process (or does not answer) is only killed."""
    import ray

    if actor.pid and drain_s > 0:
        try:
            ray.get(actor.handle.stop.remote(min(drain_s, 30.0)), timeout=drain_s + 5)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            pass
    ray.kill(actor.handle, no_restart=True)


def excerpt(text: str, limit: int = RAY_SAYS_CHARS) -> str:
    """The first line of what Ray says, cut at a word (Ray's messages run to pages)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " ..."


def _wait_name_free(name: str, timeout_s: float = 60.0) -> None:
    """A killed actor's name is free once Ray has seen it die (a new actor takes it then)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.1)
    raise RayStartError(f"Ray still lists the killed actor {name} after {timeout_s:.0f}s")


# --- this process's Ray connection, shared by the groups of concurrent runs ---
_ray_lock = threading.Lock()
_ray_users = 0
_ray_ours = False  # initialised here (not by a caller of this process): shut down after the last group


def _join_ray(address: str, num_cpus: int) -> None:
    """Join the cluster at `address` (or RAY_ADDRESS); else start a local one that fits the run:
    its logical CPUs are at least one per actor, even on a 2-core laptop."""
    global _ray_users, _ray_ours
    import ray

    with _ray_lock:
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS", "")
            try:
                if address:
                    problem = head_problem(address, timeout_s=10.0)
                    if problem:
                        raise ConnectionError(problem)
                    ray.init(address=address, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(num_cpus=max(os.cpu_count() or 1, num_cpus), include_dashboard=False,
                             log_to_driver=False)  # fmt: skip
            except ConnectionError as exc:
                raise RayStartError(
                    f"cannot reach the Ray cluster: {exc}{join_failure_hint(address)}"
                ) from None
            _ray_ours = True
        elif address and ":" in address and not address.startswith("ray://"):
            joined = ray.get_runtime_context().gcs_address
            if address != joined:
                raise RayStartError(
                    f"ray_address {address}: this coordinator is already joined to the Ray cluster at "
                    f"{joined} (one cluster per coordinator process)"
                )
        _ray_users += 1


def _leave_ray() -> None:
    global _ray_users, _ray_ours
    import ray

    with _ray_lock:
        _ray_users -= 1
        if _ray_users == 0 and _ray_ours:
            ray.shutdown()
            _ray_ours = False
