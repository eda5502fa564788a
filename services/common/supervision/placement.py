"""Which Ray actors a run needs, what each asks for, and where they would go (pure logic; no Ray
import).

    trainer-0 .. trainer-{world_size-1}    one per FSDP rank      {CPU: ray_trainer_num_cpus,
                                                                    GPU: ray_trainer_num_gpus on a GPU cluster}
    rollout-0 .. rollout-{engines-1}      one rollout service per engine
                                            {CPU: ray_rollout_num_cpus,
                                             GPU: rollout_num_gpus_per_engine on a GPU cluster}
    dataloader                              {CPU: ray_dataloader_num_cpus}
    each plus ray_<service>_resources (custom resources: node labels such as {node_trainer: 1})

engines = rollout_num_gpus / rollout_num_gpus_per_engine (SGLang: each rollout service runs one
server with tensor parallelism rollout_num_gpus_per_engine; hf: one in-process engine each).
Services the run config attaches to (trainer_addr, ...) get no actor, and neither does the
coordinator (it places the run). All bundles go into one placement group with the run's
ray_placement_strategy (Ray's PACK, SPREAD, STRICT_PACK, STRICT_SPREAD).

check_cluster refuses what Ray could never place (a resource no node has, a bundle bigger than
every node, STRICT_SPREAD with more bundles than nodes); simulate estimates where each actor goes
and node_losses whether the run survives the loss of any one node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
SERVICES = ("trainer", "rollout", "dataloader")
# Resources every Ray node reports that say nothing about placement here (memory is not requested).
_HIDDEN = ("memory", "object_store_memory")
_EPSILON = 1e-9


class PlacementError(ValueError):
    """The run cannot be laid out on this cluster; the message says why."""


@dataclass(frozen=True)
class ActorSpec:
    """One Ray actor hosting one service process (or one trainer worker rank)."""

    name: str
    service: str
    index: int
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def is_trainer_worker(self) -> bool:
        """Trainer ranks 1..N-1 run `python -m rollway.trainer.worker`, not a gRPC service."""
        return self.service == "trainer" and self.index > 0


@dataclass(frozen=True)
class PlacementSettings:
    """What a run asks of Ray: the coordinator's ray_* settings (defaults: theirs)."""

    strategy: str = "PACK"
    num_cpus: Mapping[str, float] = field(default_factory=lambda: dict.fromkeys(SERVICES, 1.0))
    trainer_num_gpus: float = 1.0
    resources: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, coordinator) -> PlacementSettings:
        """From a CoordinatorConfig (its ray_placement_strategy, ray_<service>_num_cpus, ...)."""
        return cls(
            strategy=coordinator.ray_placement_strategy,
            num_cpus={s: getattr(coordinator, f"ray_{s}_num_cpus") for s in SERVICES},
            trainer_num_gpus=coordinator.ray_trainer_num_gpus,
            resources={s: dict(getattr(coordinator, f"ray_{s}_resources")) for s in SERVICES},
        )

    def bundle(self, service: str, gpus: float) -> dict[str, float]:
        """One actor's bundle: its CPUs, `gpus` where it has any, its custom resources."""
        bundle = {"CPU": float(self.num_cpus.get(service, 1.0))}
        if gpus > 0:
            bundle["GPU"] = float(gpus)
        bundle.update({k: float(v) for k, v in self.resources.get(service, {}).items() if v > 0})
        return bundle


def setting_of(service: str, resource: str) -> str:
    """The run setting that asks for `resource` on a `service` actor (for error messages)."""
    if resource == "CPU":
        return f"ray_{service}_num_cpus"
    if resource == "GPU":
        return "ray_trainer_num_gpus" if service == "trainer" else "rollout_num_gpus_per_engine"
    return f"ray_{service}_resources"


def num_rollout_engines(rollout_config) -> int:
    """Rollout services to start: rollout_num_gpus / rollout_num_gpus_per_engine (at least one)."""
    per_engine = rollout_config.rollout_num_gpus_per_engine
    if rollout_config.rollout_num_gpus % per_engine:
        raise PlacementError(
            f"rollout_num_gpus ({rollout_config.rollout_num_gpus}) must be a multiple of "
            f"rollout_num_gpus_per_engine ({per_engine})"
        )
    return max(rollout_config.rollout_num_gpus // per_engine, 1)


def plan_actors(
    configs: dict, services: list[str], cluster_gpus: float, settings: PlacementSettings | None = None
) -> list[ActorSpec]:
    """The actors that start `services` of a run (`configs`: its trainer and rollout settings;
    `settings`: its ray_* settings, the defaults without)."""
    settings = settings or PlacementSettings()
    trainer, rollout = configs["trainer"], configs["rollout"]
    use_gpus = cluster_gpus > 0
    if (
        "rollout" in services
        and rollout.rollout_engine == "sglang"
        and not rollout.sglang_urls
        and not use_gpus
    ):
        raise PlacementError("rollout_engine sglang needs GPUs, and this Ray cluster has none")
    specs: list[ActorSpec] = []
    if "trainer" in services:
        bundle = settings.bundle("trainer", settings.trainer_num_gpus if use_gpus else 0.0)
        specs += [
            ActorSpec(f"trainer-{rank}", "trainer", rank, dict(bundle)) for rank in range(trainer.world_size)
        ]
    if "rollout" in services:
        per_engine = rollout.rollout_num_gpus_per_engine
        bundle = settings.bundle("rollout", per_engine if use_gpus and not rollout.sglang_urls else 0.0)
        specs += [
            ActorSpec(f"rollout-{i}", "rollout", i, dict(bundle)) for i in range(num_rollout_engines(rollout))
        ]
    if "dataloader" in services:
        specs.append(ActorSpec("dataloader", "dataloader", 0, settings.bundle("dataloader", 0.0)))
    needed_gpus = sum(s.resources.get("GPU", 0.0) for s in specs)
    if needed_gpus > cluster_gpus:
        raise PlacementError(f"the run needs {needed_gpus:g} GPUs and the Ray cluster has {cluster_gpus:g}")
    return specs


def check_fits(specs: list[ActorSpec], cluster: dict[str, float]) -> None:
    """Refuse at once (rather than wait for placement) when the cluster is too small in total."""
    for resource in ("CPU", "GPU"):
        needed = sum(s.resources.get(resource, 0.0) for s in specs)
        if needed > cluster.get(resource, 0.0):
            raise PlacementError(
                f"the run's actors need {needed:g} {resource} in total and the Ray cluster has "
                f"{cluster.get(resource, 0.0):g}"
            )


def describe(specs: list[ActorSpec]) -> str:
    """One line per actor, for the launcher's output."""
    return "\n".join(f"  {s.name:<14} {resources_text(s.resources)}" for s in specs)


# --- the cluster: nodes, what Ray could never place, where it would place ---


@dataclass(frozen=True)
class Node:
    """A live Ray node: its IP and its total resources (CPU, GPU, custom, node:<ip>, ...)."""

    ip: str
    resources: dict[str, float]


def resources_text(resources: Mapping[str, float]) -> str:
    """`CPU 1, GPU 2, node_trainer 1`: CPU and GPU first, without Ray's memory and node:<ip> entries."""
    shown = [k for k in resources if k not in _HIDDEN and not k.startswith("node:")]
    ordered = sorted(shown, key=lambda k: (k not in ("CPU", "GPU"), k))
    return ", ".join(f"{k} {resources[k]:g}" for k in ordered) or "nothing"


def nodes_text(nodes: list[Node]) -> str:
    return "; ".join(f"{n.ip} ({resources_text(n.resources)})" for n in nodes)


def total_resources(nodes: list[Node]) -> dict[str, float]:
    """The cluster's resources summed over its nodes (what ray.cluster_resources() says)."""
    total: dict[str, float] = {}
    for node in nodes:
        for k, v in node.resources.items():
            total[k] = total.get(k, 0.0) + v
    return total


def _fits(need: Mapping[str, float], free: Mapping[str, float]) -> bool:
    return all(free.get(k, 0.0) + _EPSILON >= v for k, v in need.items() if v > 0)


def _total(specs: list[ActorSpec]) -> dict[str, float]:
    total: dict[str, float] = {}
    for spec in specs:
        for k, v in spec.resources.items():
            total[k] = total.get(k, 0.0) + v
    return total


def check_cluster(specs: list[ActorSpec], strategy: str, nodes: list[Node]) -> None:
    """Refuse, naming the setting, what Ray could never place on these nodes (it would wait until
    the placement timeout): a resource no node has, a bundle bigger than every node, more bundles
    than nodes with STRICT_SPREAD, a group bigger than every node with STRICT_PACK."""
    if not specs:
        return
    if not nodes:
        raise PlacementError("the Ray cluster has no live node")
    for spec in specs:
        for key, amount in spec.resources.items():
            if amount > 0 and not any(n.resources.get(key, 0.0) > 0 for n in nodes):
                raise PlacementError(
                    f"{setting_of(spec.service, key)}: {spec.name} asks for {key} {amount:g}, and no node "
                    f"of the Ray cluster has {key}; the nodes have: {nodes_text(nodes)}"
                )
        if not any(_fits(spec.resources, n.resources) for n in nodes):
            short = [k for k, v in spec.resources.items() if v > max(n.resources.get(k, 0.0) for n in nodes)]
            names = sorted({setting_of(spec.service, k) for k in short or spec.resources})
            raise PlacementError(
                f"{', '.join(names)}: {spec.name} needs {resources_text(spec.resources)} on one node, and "
                f"no node has that much; the nodes have: {nodes_text(nodes)}"
            )
    if strategy == "STRICT_SPREAD" and len(specs) > len(nodes):
        raise PlacementError(
            f"ray_placement_strategy: STRICT_SPREAD puts each of the run's {len(specs)} actors on a node "
            f"of its own, and the Ray cluster has {len(nodes)} node{'s' * (len(nodes) != 1)}: {nodes_text(nodes)}"
        )
    if strategy == "STRICT_PACK" and not any(_fits(_total(specs), n.resources) for n in nodes):
        raise PlacementError(
            f"ray_placement_strategy: STRICT_PACK puts all of the run's actors on one node, and together "
            f"they need {resources_text(_total(specs))}; the nodes have: {nodes_text(nodes)}"
        )


@dataclass
class Layout:
    """Where each actor would go (an estimate: a greedy simulation of Ray's strategy, which scores
    nodes its own way), and what each node has left then."""

    where: dict[str, str | None]  # actor name -> node ip; None: no room found
    free: dict[str, dict[str, float]]  # node ip -> resources left

    @property
    def unplaced(self) -> list[str]:
        return [name for name, ip in self.where.items() if ip is None]


def simulate(specs: list[ActorSpec], strategy: str, nodes: list[Node]) -> Layout:
    """Place the bundles in order on `nodes` (their total resources) as `strategy` would:
    PACK on as few nodes as possible, SPREAD over as many, STRICT_PACK on one, STRICT_SPREAD one
    per node."""
    free = {n.ip: dict(n.resources) for n in nodes}
    where: dict[str, str | None] = dict.fromkeys((s.name for s in specs), None)
    if strategy == "STRICT_SPREAD":
        for name, ip in _one_per_node(specs, [n.ip for n in nodes], free).items():
            where[name] = ip
    elif strategy == "STRICT_PACK" or (strategy == "PACK" and specs):
        home = next((n.ip for n in nodes if _fits(_total(specs), free[n.ip])), None)
        if home is not None:
            where = dict.fromkeys(where, home)
        elif strategy == "PACK":  # no node holds all: fill the nodes in turn, used ones first
            used: list[str] = []
            for spec in specs:
                order = used + [n.ip for n in nodes if n.ip not in used]
                where[spec.name] = ip = next((ip for ip in order if _fits(spec.resources, free[ip])), None)
                if ip is not None:
                    _take(free[ip], spec.resources)
                    used += [ip] if ip not in used else []
            return Layout(where, free)
    else:  # SPREAD: each bundle to the node with the fewest of the run's bundles that has room
        count = {n.ip: 0 for n in nodes}
        for spec in specs:
            fitting = [n.ip for n in nodes if _fits(spec.resources, free[n.ip])]
            ip = min(fitting, key=lambda ip: count[ip], default=None)
            where[spec.name] = ip
            if ip is not None:
                count[ip] += 1
                _take(free[ip], spec.resources)
        return Layout(where, free)
    by_name = {s.name: s for s in specs}
    for name, ip in where.items():
        if ip is not None:
            _take(free[ip], by_name[name].resources)
    return Layout(where, free)


def _take(free: dict[str, float], need: Mapping[str, float]) -> None:
    for k, v in need.items():
        free[k] = free.get(k, 0.0) - v


def _one_per_node(specs: list[ActorSpec], ips: list[str], free: Mapping[str, Mapping[str, float]]) -> dict:
    """A bundle per node, each on a node it fits (bipartite matching by augmenting paths, so the
    order of the bundles cannot make a possible layout look impossible)."""
    holder: dict[str, ActorSpec] = {}  # node ip -> bundle on it

    def assign(spec: ActorSpec, seen: set[str]) -> bool:
        for ip in ips:
            if ip in seen or not _fits(spec.resources, free[ip]):
                continue
            seen.add(ip)
            if ip not in holder or assign(holder[ip], seen):
                holder[ip] = spec
                return True
        return False

    for spec in specs:
        assign(spec, set())
    return {spec.name: ip for ip, spec in holder.items()}


def node_losses(specs: list[ActorSpec], strategy: str, nodes: list[Node], layout: Layout) -> dict[str, str]:
    """For each node whose loss the run would not survive: why (empty: it survives the loss of any
    one node). Losing a node, its actors must be placed again on what the other nodes have left
    (Ray reschedules the lost bundles, never back onto the lost node); with STRICT_SPREAD each on
    a node holding none of the run's, with STRICT_PACK all together on one node."""
    losses: dict[str, str] = {}
    by_node: dict[str, list[ActorSpec]] = {}
    for spec in specs:
        if layout.where.get(spec.name):
            by_node.setdefault(layout.where[spec.name], []).append(spec)
    for lost, lost_specs in by_node.items():
        others = [n for n in nodes if n.ip != lost]
        names = ", ".join(s.name for s in lost_specs)
        if not others:
            losses[lost] = f"{names} would have nowhere to go: the cluster has no other node"
            continue
        if strategy == "STRICT_SPREAD":
            empty = [n.ip for n in others if n.ip not in by_node]
            if len(_one_per_node(lost_specs, empty, layout.free)) < len(lost_specs):
                losses[lost] = (
                    f"STRICT_SPREAD needs a node holding none of the run's actors for each of {names}, "
                    f"and the other nodes with room are {', '.join(empty) or 'none'}"
                )
            continue
        need = [_total(lost_specs)] if strategy == "STRICT_PACK" else [s.resources for s in lost_specs]
        if not _place_all(need, {n.ip: dict(layout.free[n.ip]) for n in others}):
            left = "; ".join(f"{n.ip} ({resources_text(layout.free[n.ip])})" for n in others)
            losses[lost] = (
                f"{names} ({resources_text(_total(lost_specs))}) would not fit what the other nodes have left: {left}"
            )
    return losses


def _place_all(needs: list[Mapping[str, float]], free: dict[str, dict[str, float]]) -> bool:
    """First fit, largest first (by CPU+GPU), into `free` (changed)."""
    for need in sorted(needs, key=lambda r: -(r.get("GPU", 0.0) * 1000 + r.get("CPU", 0.0))):
        ip = next((ip for ip, f in free.items() if _fits(need, f)), None)
        if ip is None:
            return False
        _take(free[ip], need)
    return True


def layout_text(specs: list[ActorSpec], strategy: str, nodes: list[Node]) -> str:
    """Each actor, its resources and the node it would go to, then whether the run survives the loss
    of any one node and, where not, which node's loss and why."""
    layout = simulate(specs, strategy, nodes)
    lines = [
        f"Ray placement ({strategy}; where each actor goes is an estimate: Ray scores nodes its own way)"
    ]
    lines += [
        f"  {s.name:<14} {resources_text(s.resources):<32} -> {layout.where[s.name] or 'NO ROOM'}"
        for s in specs
    ]
    lines.append(f"nodes: {nodes_text(nodes)}")
    if layout.unplaced:
        lines.append(f"does not fit: no room for {', '.join(layout.unplaced)}")
        return "\n".join(lines)
    losses = node_losses(specs, strategy, nodes, layout)
    if not losses:
        lines.append("survives the loss of any one node: yes")
    else:
        lines.append("survives the loss of any one node: no")
        lines += [f"  losing {ip}: {why}" for ip, why in losses.items()]
    return "\n".join(lines)
