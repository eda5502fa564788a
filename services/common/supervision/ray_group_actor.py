"""One actor of a RayServiceGroup as the coordinator sees it: its record (spec, bundle, node,
process, the poll in flight) and what is done to one actor alone: create it in its bundle, stop
it, wait until its name is free, quote what Ray said when it died.

The actor's own code, which runs on its node, is ray_actors.ServiceHost; this module is the
coordinator's side of it. It is apart from ray_services so that the group there reads as the
start / restart / stop of many actors, and the watch (ray_actor_watch) shares the same record.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from rollway.common.supervision.placement import ActorSpec
from rollway.common.supervision.ray_actors import ServiceHost
from rollway.common.supervision.ray_connection import RayStartError

NAMESPACE = "rollway"  # actors are named rollway-<run id>-<actor> in it, whichever process placed them
RAY_SAYS_CHARS = 300
# Settings taken from the coordinator's environment into every actor's (a node's `ray start` may lack them).
FORWARDED_ENV = (
    "ROLLWAY_AUTH_TOKEN",
    "ROLLWAY_TLS_CA",
    "ROLLWAY_TLS_CERT",
    "ROLLWAY_TLS_KEY",
    "ROLLWAY_TLS_SERVER_NAME",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)


def forwarded_env() -> dict[str, str]:
    """The FORWARDED_ENV variables set in this process."""
    return {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}


@dataclass
class GroupActor:
    """One actor of the group, and the process it hosts."""

    spec: ActorSpec
    bundle: int
    handle: object
    node: dict
    generation: int = 0
    pid: int = 0  # 0 until its process is started (a stop then only kills the actor)
    address: str = ""  # empty for trainer workers (no gRPC)
    poll: object = None  # the poll in flight (a Ray ObjectRef), sent at poll_sent
    poll_sent: float = 0.0
    quiet_since: float = 0.0  # when its current unreachable spell began (0: it answers)
    last_spell: tuple[float, float] | None = None  # (start, end) of its last unreachable spell

    @property
    def where(self) -> str:
        return f"Ray actor {self.spec.name} on node {self.node['ip']}"

    @property
    def service_index(self) -> tuple[str, int]:
        """The service it serves: a trainer rank is the trainer."""
        return self.spec.service, 0 if self.spec.service == "trainer" else self.spec.index


def actor_name(run_name: str, spec: ActorSpec) -> str:
    """Its name in NAMESPACE: the run id and the actor's own name."""
    return f"rollway-{run_name}-{spec.name}"


def new_actor(run_name: str, spec: ActorSpec, workdir: Path, placement_group, bundle: int, generation: int):
    """A ServiceHost actor for `spec` in bundle `bundle` of the run's placement group (its handle):
    the bundle, not a node, is what a restart keeps, so Ray may re-place it off a lost node."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return (
        ray.remote(ServiceHost)
        .options(
            name=actor_name(run_name, spec),
            namespace=NAMESPACE,
            num_cpus=spec.resources.get("CPU", 0.0),
            num_gpus=spec.resources.get("GPU", 0.0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group, placement_group_bundle_index=bundle
            ),
            runtime_env={"env_vars": forwarded_env()},
        )
        .remote(spec.name, str(workdir), generation)
    )


def stop_actor(actor: GroupActor, drain_s: float) -> None:
    """Its process by pid (a drain of up to `drain_s`), then the actor; a dead actor took its
    process with it, and one that never started a process (or does not answer) is only killed."""
    import ray

    if actor.pid and drain_s > 0:
        try:
            ray.get(actor.handle.stop.remote(min(drain_s, 30.0)), timeout=drain_s + 5)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            pass
    ray.kill(actor.handle, no_restart=True)


def wait_name_free(name: str, timeout_s: float = 60.0) -> None:
    """A killed actor's name is free once Ray has seen it die (a new actor takes it then)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.1)
    raise RayStartError(f"Ray still lists the killed actor {name} after {timeout_s:.0f}s")


def excerpt(text: str, limit: int = RAY_SAYS_CHARS) -> str:
    """The first line of what Ray says, cut at a word (Ray's messages run to pages)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " ..."
