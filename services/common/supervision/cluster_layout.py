"""Where a run's Ray actors would go on a cluster's nodes (pure logic; no Ray import).

check_cluster refuses what Ray could never place (a resource no node has, a bundle bigger than
every node, STRICT_SPREAD with more bundles than nodes, STRICT_PACK with more than any node
holds); simulate estimates where each actor goes under the run's strategy, and node_losses
whether the run survives the loss of any one node (`rollway plan --launcher ray` prints both, the
coordinator logs them at StartRun).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rollway.common.supervision.placement import ActorSpec, PlacementError, resources_text, setting_of

_EPSILON = 1e-9


@dataclass(frozen=True)
class Node:
    """A live Ray node: its IP and its total resources (CPU, GPU, custom, node:<ip>, ...)."""

    ip: str
    resources: dict[str, float]


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
