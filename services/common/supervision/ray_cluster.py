"""Reaching a Ray cluster: whether its head answers, why a join failed, and a short look at its
nodes for `rollway plan --launcher ray` (which joins as a driver, reads the nodes and leaves).
Ray's node table itself is read in ray_nodes."""

from __future__ import annotations

import os
import socket
import sys

from rollway.common.supervision.cluster_layout import Node
from rollway.common.supervision.ray_nodes import live_nodes

PLAN_CONNECT_TIMEOUT_S = 5.0


def head_problem(address: str, timeout_s: float = PLAN_CONNECT_TIMEOUT_S) -> str:
    """Why nothing answers at a [ray://]host:port address ("" when something listens there, or for
    "auto", which Ray resolves itself). ray.init would retry an unanswered address for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not port.isdigit():
        return ""
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return f"nothing answers at {address} ({exc}); is the Ray head running there?"
    return ""


def join_failure_hint(address: str) -> str:
    """Where the head answered on its port and ray.init still failed, the likely causes: Ray's token
    auth (a head with RAY_AUTH_MODE=token or ~/.ray/auth_token refuses a driver without the token,
    and ray.init only times out) or another Ray or Python version than the head's."""
    import ray

    port = address.rpartition(":")[2]
    if address.startswith("ray://") or not port.isdigit() or head_problem(address):
        return ""  # no head answered, or an address form whose head was not checked
    mode = os.environ.get("RAY_AUTH_MODE", "")
    return (
        f"; the head answers at {address}, so the likely cause is Ray's token auth: a head started with "
        "RAY_AUTH_MODE=token (or with ~/.ray/auth_token) needs RAY_AUTH_MODE=token and the same token "
        "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) in the coordinator's environment "
        f"(here RAY_AUTH_MODE is {mode or 'unset'}); else a Ray or Python version other than the head's "
        f"(this coordinator: Ray {ray.__version__}, Python {sys.version.split()[0]})"
    )


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
    except ConnectionError as exc:
        return None, f"cannot join the Ray cluster at {address}: {exc}{join_failure_hint(address)}"
    except RuntimeError as exc:  # Ray's "Version mismatch": another Ray or Python than the head's
        return None, f"cannot join the Ray cluster at {address}: {exc}"
    try:
        return live_nodes(), f"the Ray cluster at {address}"
    finally:
        ray.shutdown()
