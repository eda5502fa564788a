"""A Ray cluster of network namespaces on one machine: each "node" is a namespace with its own
address and its own Ray node, so placement, node loss and partitions behave as on real machines.

    namespace <prefix>br      bridge br0 ── v1 ── eth0 198.18.0.1  <prefix>n1  Ray head (0 CPUs)
                                        ├── v2 ── eth0 198.18.0.2  <prefix>n2  Ray worker (1 CPU)
                                        └── vN ── eth0 198.18.0.N  <prefix>nN  ...

    cluster = NetnsCluster(num_workers=5).start()     # every node alive in Ray, or an error
    cluster.run_in(0, ["rollway", "run", ...], env)   # a process inside the head's namespace
    cluster.kill_node(3); cluster.wait_dead(3)        # kill -9 of its every pid; Ray's verdict
    cluster.start_node(3)                             # a fresh Ray node there ("a node added")
    cluster.partition(2); cluster.heal(2)             # its link down / up
    cluster.rate_limit(2, "200mbit")                  # a slow link (tbf)
    cluster.close()                                   # every pid of ours, the namespaces, temp dirs

Nothing is added to the root namespace (it cannot reach 198.18.0.0/15, by design: no traffic leaves
the machine), so Ray is asked about its nodes from a probe process inside the head's namespace.
Namespace names start with `rw<pid>.<n>-` so parallel or leftover clusters never collide. Ray runs with
a HOME of the cluster's own: Ray 2.60 turns token auth on when ~/.ray/auth_token exists, which the
machine's own HOME may have. Processes are stopped by pid (`ip netns pids`), never `ray stop`
(which finds Ray processes by name on the whole machine).

This module is the cluster: its nodes, Ray on them, and the faults. The `ip`/`tc` plumbing and
the cleanup of namespaces by pid are in netns.py; the probe that reads Ray's node table is in
netns_ray_probe.py.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollway.common.supervision import ray_health
from rollway.deploy import netns
from rollway.deploy.netns import ClusterError
from rollway.deploy.netns_ray_probe import RayProbe

SUBNET_PREFIX = 15  # 198.18.0.0/15, the benchmarking range (RFC 2544): never anyone else's
HEAD_PORT = 6379
NODE_START_TIMEOUT_S = 120.0
# A killed node refuses at once: Ray's verdict takes threshold x period (15 s by default, 1.5 s
# with these). A cut-off one fails by timeouts: threshold x (period + timeout) (65 s by default,
# 31.5 s with these). What a user tunes for quicker verdicts on lost nodes; rollway's supervision
# scales its windows on cut-off nodes to it (rollway.common.supervision.ray_nodes). Each check keeps
# Ray's 10 s to answer: a raylet busy starting on a loaded machine must not be declared dead.
HEALTH_CHECK_FAST = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}


def unavailable_reason() -> str:
    """Why namespaces cannot be built here ("" when they can): tests skip naming it (fail on CI)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    return ""


@dataclass
class Node:
    """One namespace and the Ray node in it. `index` 0 is the head."""

    index: int
    namespace: str
    ip: str
    num_cpus: int
    resources: dict[str, float] = field(default_factory=dict)
    temp_dir: str = ""
    num_starts: int = 0


class NetnsCluster:
    """A head (`head_cpus`, default 0, so no actor lands on it) and `num_workers` worker nodes of
    `worker_cpus` CPUs each; `worker_resources[i]` adds custom Ray resources to worker i (1-based
    node index). `env`: variables every Ray node and every `run_in` process gets (PYTHONPATH ...).
    `ray_system_config`: Ray's system config, given to the head (`ray start --system-config`; the
    other nodes and every driver take it from there), e.g. HEALTH_CHECK_FAST for a quicker verdict
    on a killed node."""

    def __init__(
        self,
        num_workers: int = 5,
        *,
        head_cpus: int = 0,
        worker_cpus: int = 1,
        worker_resources: dict[int, dict[str, float]] | None = None,
        env: dict[str, str] | None = None,
        object_store_bytes: int = 100_000_000,
        ray_bin: str = "",
        ray_system_config: dict[str, object] | None = None,
    ):
        # rw<pid>.<n>-: the process's n-th cluster (a process may hold two at once: a test's own
        # network beside the shared cluster).
        self.prefix = f"rw{os.getpid()}.{next(_CLUSTER_NUMBERS)}-"
        self.bridge_ns = f"{self.prefix}br"
        self.ray_bin = ray_bin or str(Path(sys.executable).with_name("ray"))
        self.object_store_bytes = object_store_bytes
        self.ray_system_config = dict(ray_system_config or {})
        # Short: Ray's unix sockets live under each node's temp dir (a path limit of 107 bytes).
        self.root = Path(tempfile.mkdtemp(prefix=self.prefix, dir="/tmp"))
        self.home = self.root / "home"
        self.home.mkdir()
        resources = worker_resources or {}
        self.nodes = [Node(0, f"{self.prefix}n0", "198.18.0.1", head_cpus)] + [
            Node(i, f"{self.prefix}n{i}", f"198.18.0.{i + 1}", worker_cpus, dict(resources.get(i, {})))
            for i in range(1, num_workers + 1)
        ]
        self.env = self._node_env(env or {})
        self._namespaces: list[str] = []
        self._probe = RayProbe(functools.partial(self.run_in, 0), self.ray_address)
        self._cut_since: dict[int, float] = {}
        self.long_partitioned: set[int] = set()  # nodes Ray may declare dead late (restart them to be sure)
        self._closed = False
        netns.remove_leftovers()
        atexit.register(self.close)

    @property
    def silent_verdict_s(self) -> float:
        """The longest Ray takes to declare a cut-off node dead, with this cluster's health checks."""
        return ray_health.silent_verdict_s(self.ray_system_config)

    @property
    def long_partition_s(self) -> float:
        """A partition this long may end in Ray's verdict after it heals (see `long_partitioned`):
        its raylet then exits."""
        return ray_health.long_spell_s(self.silent_verdict_s)

    @property
    def ray_address(self) -> str:
        return f"{self.nodes[0].ip}:{HEAD_PORT}"

    def _node_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(HOME=str(self.home), RAY_USAGE_STATS_ENABLED="0", **extra)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    # --- build ---
    def start(self) -> NetnsCluster:
        """Build the namespaces and start Ray on every node; returns once Ray lists all alive."""
        try:
            self.build_network()
            self._start_ray(self.nodes[0])
            for node in self.nodes[1:]:
                self._start_ray(node)
            self.wait_alive([n.index for n in self.nodes])
        except BaseException:
            self.close()
            raise
        return self

    def build_network(self) -> None:
        """The bridge namespace and every node namespace with its address (no Ray yet)."""
        self._add_namespace(self.bridge_ns)
        netns.ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        netns.ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        for node in self.nodes:
            ns, peer = node.namespace, f"v{node.index}"
            self._add_namespace(ns)
            # Made inside the node's namespace with its peer in the bridge's: never in the root one.
            netns.ip(
                "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", self.bridge_ns
            )
            netns.ip("-n", self.bridge_ns, "link", "set", peer, "master", "br0", "up")
            netns.ip("-n", ns, "addr", "add", f"{node.ip}/{SUBNET_PREFIX}", "dev", "eth0")
            netns.ip("-n", ns, "link", "set", "eth0", "up")
            netns.ip("-n", ns, "link", "set", "lo", "up")

    def _add_namespace(self, name: str) -> None:
        netns.ip("netns", "add", name)
        self._namespaces.append(name)

    def _start_ray(self, node: Node) -> None:
        node.num_starts += 1
        node.temp_dir = str(self.root / f"n{node.index}-{node.num_starts}")  # a fresh one per start
        argv = [
            self.ray_bin,
            "start",
            "--node-ip-address",
            node.ip,
            "--num-cpus",
            str(node.num_cpus),
            "--temp-dir",
            node.temp_dir,
            "--object-store-memory",
            str(self.object_store_bytes),
            "--disable-usage-stats",
        ]
        if node.index == 0:
            argv += ["--head", "--port", str(HEAD_PORT), "--include-dashboard=false"]
            if self.ray_system_config:
                argv += ["--system-config", json.dumps(self.ray_system_config)]
        else:
            argv += ["--address", self.ray_address]
        if node.resources:
            argv += ["--resources", json.dumps(node.resources)]
        started = subprocess.run(
            ["ip", "netns", "exec", node.namespace, *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=NODE_START_TIMEOUT_S,
        )
        if started.returncode != 0:
            raise ClusterError(
                f"ray start on node {node.index} ({node.ip}) exited with {started.returncode}:\n"
                f"{started.stdout[-2000:]}{started.stderr[-2000:]}"
            )

    # --- processes in a node ---
    def run_in(
        self, node: int, argv: list[str], env: dict[str, str] | None = None, **popen
    ) -> subprocess.Popen:
        """Start `argv` inside node `node`'s namespace with the cluster's environment plus `env`."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.nodes[node].namespace, *argv],
            env={**self.env, **(env or {})},
            **popen,
        )

    def pids(self, node: int) -> list[int]:
        """Every process in node `node`'s namespace (Ray's and any `run_in`)."""
        out = netns.ip("netns", "pids", self.nodes[node].namespace)
        return [int(p) for p in out.split()]

    # --- what Ray says ---
    def ray_nodes(self) -> list[dict]:
        """Ray's node table ({ip, alive, node_id, resources} each), asked from the head's namespace."""
        return self._probe.nodes()

    def node_alive_in_ray(self, node: int) -> bool:
        """Whether Ray lists an alive node at that node's address (its latest start)."""
        ip = self.nodes[node].ip
        return any(n["alive"] for n in self.ray_nodes() if n["ip"] == ip)

    def node_of(self, ip: str) -> int:
        """The index of the node with address `ip` (ray.json's "node" of an actor)."""
        for node in self.nodes:
            if node.ip == ip:
                return node.index
        raise KeyError(f"no node of this cluster has the address {ip}")

    def wait_alive(self, nodes: list[int], timeout: float = NODE_START_TIMEOUT_S) -> None:
        """Until Ray lists every one of `nodes` alive."""
        self._wait(
            lambda: all(self.node_alive_in_ray(i) for i in nodes), timeout, f"nodes {nodes} alive in Ray"
        )

    def wait_dead(self, node: int, timeout: float = 120.0) -> float:
        """Until Ray's verdict that `node` is dead; returns the seconds waited."""
        started = time.monotonic()
        self._wait(
            lambda: not self.node_alive_in_ray(node), timeout, f"Ray's verdict that node {node} is dead"
        )
        return time.monotonic() - started

    @staticmethod
    def _wait(condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.5)

    # --- faults ---
    def kill_node(self, node: int) -> list[int]:
        """SIGKILL every process of the node (raylet, workers, actors): the node is lost."""
        return netns.kill_pids(self.pids(node))

    def start_node(self, node: int, wait: bool = True) -> None:
        """A fresh Ray node in that namespace (after kill_node, or a raylet that exited): a node added."""
        self._start_ray(self.nodes[node])
        if wait:
            self.wait_alive([node])

    def partition(self, node: int) -> None:
        """Cut the node off the others (its link down); its processes run on."""
        netns.ip("-n", self.nodes[node].namespace, "link", "set", "eth0", "down")
        self._cut_since[node] = time.monotonic()

    def heal(self, node: int) -> float:
        """Its link up again; returns how long it was cut off. Ray may still declare a node dead
        that was silent for long (its raylet then exits): see `long_partitioned`."""
        netns.ip("-n", self.nodes[node].namespace, "link", "set", "eth0", "up")
        seconds = time.monotonic() - self._cut_since.pop(node, time.monotonic())
        if seconds >= self.long_partition_s:
            self.long_partitioned.add(node)
        return seconds

    def rate_limit(self, node: int, rate: str, burst: str = "256kb", latency: str = "50ms") -> None:
        """Limit the node's egress to `rate` (tc syntax: "100mbit"); netem is missing on this kernel."""
        netns.run_tool(["tc", "-n", self.nodes[node].namespace, "qdisc", "replace", "dev", "eth0", "root",
                        "tbf", "rate", rate, "burst", burst, "latency", latency])  # fmt: skip

    def clear_rate_limit(self, node: int) -> None:
        netns.run_tool(["tc", "-n", self.nodes[node].namespace, "qdisc", "del", "dev", "eth0", "root"])

    # --- teardown ---
    def close(self) -> None:
        """Kill every pid in our namespaces, delete them (their veths and the bridge go with them),
        remove the temp dirs. Safe to call twice, and at exit."""
        if self._closed:
            return
        self._closed = True
        self._probe.stop()
        for ns in reversed(self._namespaces):
            netns.delete_namespace(ns)
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


_CLUSTER_NUMBERS = itertools.count()


def main(argv: list[str] | None = None) -> int:
    """`python -m rollway.deploy.netns_cluster`: a cluster to try rollway on, until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3, help="worker nodes (1 CPU each by default)")
    parser.add_argument("--worker-cpus", type=int, default=1)
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"cannot build the cluster: {reason}", file=sys.stderr)
        return 1
    with NetnsCluster(args.workers, worker_cpus=args.worker_cpus) as cluster:
        print(f"Ray at {cluster.ray_address}; run inside the head's namespace, e.g.:")
        print(f"  ip netns exec {cluster.nodes[0].namespace} rollway run CONFIG --launcher ray "
              f"--ray-address {cluster.ray_address}")  # fmt: skip
        print(f"  (HOME={cluster.home} keeps token auth off). Ctrl-C ends the cluster.", flush=True)
        stop = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # sigwait takes them instead of a handler
        signal.sigwait(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
