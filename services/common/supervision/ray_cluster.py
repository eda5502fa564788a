"""The nodes of the Ray cluster this process is joined to, and a short look at a cluster for
`rollway plan --launcher ray` (which joins it as a driver, reads its nodes and leaves)."""

from __future__ import annotations

import os
import socket

from rollway.common.supervision.cluster_layout import Node

PLAN_CONNECT_TIMEOUT_S = 5.0


def live_nodes() -> list[Node]:
    """The cluster's live nodes and their total resources (Ray must be initialised here)."""
    import ray

    return [
        Node(n["NodeManagerAddress"], {k: float(v) for k, v in n.get("Resources", {}).items()})
        for n in ray.nodes()
        if n.get("Alive")
    ]


def head_problem(address: str, timeout_s: float = PLAN_CONNECT_TIMEOUT_S) -> str:
    """Why nothing answers at a host:port address ("" when something listens there, or for forms
    Ray resolves itself: "auto", ray://...)."""
    host, _, port = address.rpartition(":")
    if address == "auto" or address.startswith("ray://") or not port.isdigit():
        return ""
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return f"nothing answers at {address} ({exc}); is the Ray head running there?"
    return ""


def read_cluster(address: str) -> tuple[list[Node] | None, str]:
    """The nodes of the cluster at `address` (or RAY_ADDRESS), read as a short-lived driver, and
    where they come from; (None, why) when no cluster is given or none answers."""
    import ray

    if ray.is_initialized():  # this process is joined already (a test, a notebook): its cluster
        return live_nodes(), "the Ray cluster this process is joined to"
    address = address or os.environ.get("RAY_ADDRESS", "")
    if not address:
        return None, "no Ray cluster given (ray_address, RAY_ADDRESS): `rollway run` would start a local one"
    problem = head_problem(address)
    if problem:
        return None, problem
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError) as exc:  # RuntimeError: another Ray version than the head's
        return None, f"cannot join the Ray cluster at {address}: {exc}"
    try:
        return live_nodes(), f"the Ray cluster at {address}"
    finally:
        ray.shutdown()
