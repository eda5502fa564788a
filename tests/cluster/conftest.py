"""A Ray cluster of network namespaces for the tests here (rollway.deploy.netns_cluster): a head with 0
CPUs and 5 workers of 1 CPU, so a run's actors (1 CPU each, one placement group) land one per node.

Runs are `rollway run --launcher ray` inside the head's namespace (the test process cannot reach
198.18.0.0/15); they write their run directories on the shared filesystem, which the tests read.
Without root or iproute2 the tests skip naming why; on CI (CI set) they fail instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.cluster_runs import REWARD_MODULE

from rollway.deploy.netns_cluster import HEALTH_CHECK_FAST, NetnsCluster, unavailable_reason

NUM_WORKERS = 5
CLUSTER_DIR = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if CLUSTER_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.cluster)


_CLUSTER: list[NetnsCluster] = []  # the one cluster of the session's cluster tests, while they run


@pytest.fixture(scope="session")
def netns_cluster(tmp_path_factory):
    """One cluster for every module here (a cluster's start costs ~30 s of the 2 cores); it is
    closed as soon as the last test of tests/cluster is done (pytest_runtest_teardown below), not
    at the session's end, so no idle Ray node outlives these tests."""
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
    # Ray's health checks as a user tunes them for quick verdicts: a killed node is declared dead
    # after 1.5 s instead of 15 s, a cut-off one after 31.5 s instead of 65 s (HEALTH_CHECK_FAST);
    # the partitions of the tests are sized to these figures.
    cluster = NetnsCluster(NUM_WORKERS, env=env, ray_system_config=HEALTH_CHECK_FAST)
    _CLUSTER.append(cluster)
    try:
        yield cluster.start()
    finally:
        _close_cluster()


def _close_cluster() -> None:
    while _CLUSTER:
        _CLUSTER.pop().close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the test's own teardown (its `cluster` fixture revives lost nodes first)."""
    result = yield
    if _CLUSTER and (nextitem is None or CLUSTER_DIR not in Path(nextitem.path).parents):
        _close_cluster()
    return result


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
