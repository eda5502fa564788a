"""Ray's node table for NetnsCluster, asked from a process inside the head's namespace.

    NetnsCluster.ray_nodes() ─ "nodes\\n" ─> probe (python -c _PROBE, in the head's namespace)
                             <─ {"nodes": [{ip, alive, node_id, resources}, ...]} ─ GCS node table

The root namespace cannot reach the cluster's addresses (by design: no traffic leaves the
machine), so the question is put by a helper process that lives in the head's namespace and is
kept between questions (each new one imports Ray and connects to the GCS again). It is apart
from the cluster because it is its own process with its own lifecycle and its own failure modes.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Callable

from rollway.deploy.netns import ClusterError

PROBE_TIMEOUT_S = 30.0

# Asks the GCS for its node table, one JSON line per request line; runs inside the head's namespace.
_PROBE = r"""
import json, sys
from ray._private.state import GlobalState
from ray._raylet import GcsClientOptions
state = GlobalState()
state._initialize_global_state(GcsClientOptions.create(sys.argv[1], None, allow_cluster_id_nil=True,
                                                       fetch_cluster_id_if_nil=False))
for _ in sys.stdin:
    try:
        nodes = [{"ip": n["NodeManagerAddress"], "alive": n["Alive"], "node_id": n["NodeID"],
                  "resources": n.get("Resources", {})} for n in state.node_table()]
        print(json.dumps({"nodes": nodes}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
"""


class RayProbe:
    """The probe of the cluster whose head is at `ray_address`; `run_in_head(argv, **popen)`
    starts a process in the head's namespace (NetnsCluster.run_in for node 0)."""

    def __init__(self, run_in_head: Callable[..., subprocess.Popen], ray_address: str):
        self._run_in_head = run_in_head
        self._ray_address = ray_address
        self._process: subprocess.Popen | None = None

    def nodes(self) -> list[dict]:
        """Ray's node table ({ip, alive, node_id, resources} each); a probe that does not answer
        within PROBE_TIMEOUT_S is stopped (the next question starts a new one)."""
        probe = self._running()
        probe.stdin.write("nodes\n")
        probe.stdin.flush()
        ready, _, _ = select.select([probe.stdout], [], [], PROBE_TIMEOUT_S)
        line = probe.stdout.readline() if ready else ""
        if not line:
            self.stop()
            raise ClusterError(f"the Ray probe on the head did not answer within {PROBE_TIMEOUT_S:.0f}s")
        answer = json.loads(line)
        if "error" in answer:
            raise ClusterError(f"the Ray probe on the head failed: {answer['error']}")
        return answer["nodes"]

    def _running(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._process = self._run_in_head(
                [sys.executable, "-c", _PROBE, self._ray_address],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        return self._process

    def stop(self) -> None:
        """Kill the probe process (by its pid), if one runs."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
        self._process = None
