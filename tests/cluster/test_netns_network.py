"""The namespace network of NetnsCluster on its own (no Ray): nodes reach each other over the
bridge and nothing else, faults act on the node's link, and teardown leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rollway.deploy.netns_cluster import NetnsCluster, unavailable_reason


@pytest.fixture
def network():
    reason = unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"cluster tests cannot run: {reason} (CI is set, so this is a failure)")
        pytest.skip(f"cluster tests need network namespaces: {reason}")
    cluster = NetnsCluster(2)
    try:
        cluster.build_network()
        yield cluster
    finally:
        cluster.close()


def root_links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def connects(cluster: NetnsCluster, node: int, ip: str) -> bool:
    """A TCP connect from inside `node` to port 9 of `ip`: refused means reachable (nothing listens)."""
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({ip!r}, 9), timeout=1)\n"
        "except ConnectionRefusedError:\n"
        "    sys.exit(0)\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    return cluster.run_in(node, [sys.executable, "-c", probe]).wait(30) == 0


def test_nodes_reach_each_other_only_while_their_links_are_up(network):
    assert network.nodes[0].namespace.startswith(f"rw{os.getpid()}.")
    assert connects(network, 1, network.nodes[2].ip) and connects(network, 2, network.nodes[0].ip)
    routes = subprocess.run(
        ["ip", "-n", network.nodes[1].namespace, "route", "show"], capture_output=True, text=True, check=True
    ).stdout
    assert "default" not in routes and "198.18.0.0/15" in routes, routes  # no route out of the cluster
    network.partition(2)
    assert not connects(network, 1, network.nodes[2].ip)
    network.heal(2)
    assert connects(network, 1, network.nodes[2].ip)
    network.rate_limit(1, "10mbit")
    qdisc = subprocess.run(
        ["tc", "-n", network.nodes[1].namespace, "qdisc", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "tbf" in qdisc and "10Mbit" in qdisc, qdisc
    assert network.node_of("198.18.0.3") == 2


def test_teardown_leaves_nothing_and_adds_nothing_to_the_root_namespace():
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    links = root_links()
    cluster = NetnsCluster(2)
    cluster.build_network()
    sleeper = cluster.run_in(1, [sys.executable, "-c", "import time; time.sleep(600)"])
    assert root_links() == links
    names = [n.namespace for n in cluster.nodes] + [cluster.bridge_ns]
    cluster.close()
    assert sleeper.wait(10) == -9  # killed by pid, as every process of its namespaces
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(name in listed.split() for name in names), listed
    assert not cluster.root.exists()
