"""A Ray cluster of network namespaces per test module (rollway.deploy.netns_cluster): a head with 0
CPUs and 5 workers of 1 CPU, so a run's actors (1 CPU each, one placement group) land one per node.

Runs are `rollway run --launcher ray` inside the head's namespace (the test process cannot reach
198.18.0.0/15); they write their run directories on the shared filesystem, which the tests read.
Without root or iproute2 the tests skip naming why; on CI (CI set) they fail instead.
"""

from __future__ import annotations

import os

import pytest
from support.cluster_runs import REWARD_MODULE

from rollway.deploy.netns_cluster import NetnsCluster, unavailable_reason

NUM_WORKERS = 5


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/cluster/" in str(item.path):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="module")
def netns_cluster(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"cluster tests cannot run: {reason} (CI is set, so this is a failure)")
        pytest.skip(f"cluster tests need network namespaces: {reason}")
    reward_dir = tmp_path_factory.mktemp("cluster-reward")
    (reward_dir / "cluster_reward.py").write_text(REWARD_MODULE)
    pythonpath = os.pathsep.join(filter(None, [str(reward_dir), os.environ.get("PYTHONPATH", "")]))
    # Every Ray worker (hence every actor and its service) inherits its raylet's environment.
    env = {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    cluster = NetnsCluster(NUM_WORKERS, env=env)
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture
def cluster(netns_cluster):
    """The module's cluster with every worker node alive in Ray again after the test (a test that
    lost a node leaves it to this; a node cut off for long is started afresh, before Ray's late
    verdict on it could fall into the next test)."""
    yield netns_cluster
    revive_all(netns_cluster)


def revive_all(cluster: NetnsCluster) -> None:
    alive = {n["ip"] for n in cluster.ray_nodes() if n["alive"]}
    lost = [
        node.index
        for node in cluster.nodes[1:]
        if node.ip not in alive or not cluster.pids(node.index) or node.index in cluster.long_partitioned
    ]
    cluster.long_partitioned.clear()
    for index in lost:  # what is left of each (a cut-off node's actors, a raylet that lingers), all at once
        cluster.kill_node(index)
    for index in lost:
        if cluster.node_alive_in_ray(index):
            cluster.wait_dead(index)
    for index in lost:
        cluster.start_node(index, wait=False)
    if lost:
        cluster.wait_alive(lost)


def pytest_terminal_summary(terminalreporter):
    """The measured figures of every fault (the time from it to the next step logged)."""
    from support.cluster_runs import TIMINGS

    if TIMINGS:
        terminalreporter.section("cluster fault timings")
        for line in TIMINGS:
            terminalreporter.write_line(line)
