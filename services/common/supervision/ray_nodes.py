"""What Ray knows about its nodes, asked before a dead actor is replaced.

A lost node is seen in two steps. Its actors stop answering at once (a killed raylet takes its
workers with it; a cut link leaves them silent), but Ray's GCS declares the node dead only later:
~15 s after its processes are killed, 55-65 s after its link went quiet. Only then does Ray
reschedule the placement-group bundles the node held. A replacement created before that verdict
is placed on the dead node and dies with it, so a restart asks here first:

    node_answers(node)         its raylet takes a TCP connection now (alive: restart in place)
    await_verdict(node_id)     else wait for Ray's verdict (dead, or alive again), with a deadline
    await_bundle(pg, i, ...)   the bundle re-placed on a live node, or NoRoom at once when no live
                               node has the free resources to host it (naming nodes and resources)

Ray's private `state` module is the only place that has free resources per node (the public
`ray.available_resources()` is the cluster's sum); it is read in one function here.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from rollway.common.supervision import ray_health
from rollway.common.supervision.cluster_layout import Node
from rollway.common.supervision.supervisor import CannotRestart

# Ray declares a silent node dead 55-65 s after it went quiet (processes killed: ~15 s), with its
# default health checks; past this, no verdict is coming and the run fails naming the node.
VERDICT_TIMEOUT_S = 120.0
# After a long silent spell began, Ray's silent verdict (ray_health) plus this: Ray has decided by
# then (75 s with Ray's defaults).
LATE_VERDICT_MARGIN_S = 10.0
# A bundle that no live node can host is not waited for: Ray would keep it pending for ever.
NO_ROOM_GRACE_S = 5.0
POLL_S = 0.5


class NoRoom(CannotRestart):
    """No live node of the cluster can host a replacement; the message names what is missing."""


def nodes() -> dict[str, dict]:
    """Ray's node table by node id."""
    import ray

    return {node["NodeID"]: node for node in ray.nodes()}


def live_nodes() -> list[Node]:
    """The live nodes and their total resources, as placement plans with them."""
    return [
        Node(n["NodeManagerAddress"], {k: float(v) for k, v in n.get("Resources", {}).items()})
        for n in nodes().values()
        if n.get("Alive")
    ]


def silent_verdict_s() -> float:
    """The longest Ray takes to declare a silent node dead, from the cluster's health checks, which
    a connected driver takes from the head: a user who tunes them gets windows here that follow."""
    try:
        from ray._raylet import Config
    except ImportError:  # pragma: no cover - Ray is installed wherever a Ray launcher runs
        return ray_health.silent_verdict_s()
    return ray_health.silent_verdict_s({
        "health_check_failure_threshold": Config.health_check_failure_threshold(),
        "health_check_period_ms": Config.health_check_period_ms(),
        "health_check_timeout_ms": Config.health_check_timeout_ms(),
    })  # fmt: skip


def long_spell_s() -> float:
    """A silent spell this long may still end in Ray's verdict after the node answers again (20 s
    with Ray's defaults)."""
    return ray_health.long_spell_s(silent_verdict_s())


def late_verdict_s() -> float:
    """Seconds after a spell began by which Ray has given its verdict, if any (75 s by default)."""
    return silent_verdict_s() + LATE_VERDICT_MARGIN_S


def node_alive(node_id: str) -> bool:
    """Ray's current view (True until its verdict, even for a node that is gone)."""
    node = nodes().get(node_id)
    return bool(node and node["Alive"])


def node_answers(node_id: str, timeout_s: float = 1.0) -> bool:
    """Whether the node's raylet accepts a TCP connection now. A refused or silent raylet means
    the node is gone or cut off, whatever Ray's table still says."""
    node = nodes().get(node_id)
    if not node or not node["Alive"]:
        return False
    try:
        socket.create_connection((node["NodeManagerAddress"], node["NodeManagerPort"]), timeout_s).close()
    except OSError:
        return False
    return True


def await_verdict(node_id: str, *, stopping: Callable[[], bool] = lambda: False) -> bool:
    """Wait until Ray has declared the node dead (True) or its raylet answers again (False: a
    partition that healed, or a live node whose actor alone died). NoRoom when Ray says nothing
    within VERDICT_TIMEOUT_S."""
    deadline = time.monotonic() + VERDICT_TIMEOUT_S
    while time.monotonic() < deadline and not stopping():
        if not node_alive(node_id):
            return True
        if node_answers(node_id):
            return False
        time.sleep(POLL_S)
    if stopping():
        return False
    raise NoRoom(
        f"Ray gave no verdict on node {node_label(node_id)} within {VERDICT_TIMEOUT_S:.0f}s: it "
        "neither answers nor is declared dead"
    )


def node_label(node_id: str) -> str:
    node = nodes().get(node_id)
    return node["NodeManagerAddress"] if node else node_id[:12]


def plain_resources(resources: dict[str, float]) -> dict[str, float]:
    """Resources without Ray's internal ones (placement-group shares, node: markers, memory)."""
    return {
        name: amount
        for name, amount in resources.items()
        if "_group_" not in name and not name.startswith(("node:", "bundle_group"))
        and name not in ("memory", "object_store_memory")
    }  # fmt: skip


def free_by_node() -> dict[str, dict[str, float]]:
    """Free resources of each live node, by its address."""
    from ray._private import state

    live = {node_id: node for node_id, node in nodes().items() if node["Alive"]}
    free = state.state.available_resources_per_node()
    return {
        node["NodeManagerAddress"]: plain_resources(free.get(node_id, {})) for node_id, node in live.items()
    }


def hosts(free: dict[str, float], bundle: dict[str, float]) -> bool:
    return all(free.get(name, 0.0) >= amount for name, amount in bundle.items() if amount > 0)


def describe_free(free_nodes: dict[str, dict[str, float]]) -> str:
    if not free_nodes:
        return "no live node is left"
    return "; ".join(
        f"{ip}: " + (", ".join(f"{k} {v:g}" for k, v in sorted(res.items())) or "nothing") + " free"
        for ip, res in sorted(free_nodes.items())
    )


def await_bundle(
    pg, bundle: int, resources: dict[str, float], what: str, *, lost_node: str, timeout_s: float
) -> str:
    """Wait until bundle `bundle` of placement group `pg` is placed on a live node; its node id.
    NoRoom once no live node has had the free resources to host it for NO_ROOM_GRACE_S."""
    from ray.util.placement_group import placement_group_table

    deadline = time.monotonic() + timeout_s
    no_room_since = None
    while True:
        table = placement_group_table(pg)
        node_id = table.get("bundles_to_node_id", {}).get(bundle, "")
        if table.get("state") == "CREATED" and node_id and node_alive(node_id):
            return node_id
        free = free_by_node()
        if any(hosts(res, resources) for res in free.values()):
            no_room_since = None
        else:
            no_room_since = no_room_since or time.monotonic()
            if time.monotonic() - no_room_since > NO_ROOM_GRACE_S:
                wanted = ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()))
                raise NoRoom(
                    f"no node left can host {what} ({wanted}) after node {lost_node} was lost: "
                    f"{describe_free(free)}; add a node with these resources and rerun with --resume"
                )
        if time.monotonic() > deadline:
            raise NoRoom(
                f"Ray did not re-place {what}'s bundle within {timeout_s:.0f}s after node {lost_node} "
                f"was lost (placement group {table.get('state')}); free: {describe_free(free)}"
            )
        time.sleep(POLL_S)
