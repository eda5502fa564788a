"""`rollway run CONFIG --launcher ray [--ray-address ADDR]`: a run's services as Ray actors.

    driver (this process)                       Ray cluster (one placement group, PACK)
    plan_actors ─> bundles ─> actors:          trainer-0 .. trainer-{N-1}, rollout-i, dataloader, coordinator
    trainer-0: gRPC + rank 0's store (spawn_workers false) <── trainer-1..N-1: python -m rollway.trainer.worker
    addresses = actor node ip : port the service bound ──> StartRun on the coordinator actor
    follow StreamMetrics; RaySupervisor watches every actor and its process; stop all on exit

gRPC and weight sync are unchanged: the coordinator dials the services' addresses, and the weight
group meets at trainer rank 0's node on a port picked there (update_weight_master_port).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from rollway.deploy.placement import ActorSpec, PlacementError, describe, plan_actors
from rollway.deploy.ray_services import RayServices, RaySupervisor
from rollway.launcher import COORDINATOR_CRASHED, _drive, run_settings, services_needed


def run_on_ray(configs: dict, ray_address: str = "") -> int:
    """Place the run's services on Ray, drive the run, stop everything; the exit status."""
    import ray

    c = configs["coordinator"]
    from rollway.coordinator.runs import new_run_id

    run_id = c.run_id or new_run_id()
    run_dir = (Path(c.run_dir or "runs") / run_id).resolve()
    started_ray = not ray.is_initialized()
    try:
        if started_ray:
            _init_ray(ray_address, plan_actors(configs, services_needed(c), float("inf")))
        specs = plan_actors(configs, services_needed(c), ray.cluster_resources().get("GPU", 0.0))
        check_fits(specs, ray.cluster_resources())
    except (PlacementError, ConnectionError) as exc:
        what = "place the run on Ray" if isinstance(exc, PlacementError) else "reach the Ray cluster"
        print(f"cannot {what}: {exc}", file=sys.stderr)
        if started_ray and ray.is_initialized():
            ray.shutdown()
        return 2
    print(f"run {run_id}: {len(specs)} Ray actors\n{describe(specs)}", flush=True)
    interrupted = threading.Event()
    previous = signal.getsignal(signal.SIGINT)  # Ctrl-C while starting: KeyboardInterrupt, then stop all
    services = RayServices(specs, run_id, run_dir / "services")
    try:
        services.create()
        addresses = services.start_services(configs)
        coordinator = services.start_coordinator(run_dir.parent)
        supervisor = RaySupervisor(services)
        settings = run_settings(c, run_id, str(run_dir.parent), addresses)
        settings.update(services.run_overrides(c))
        signal.signal(signal.SIGINT, lambda *_: interrupted.set())  # Ctrl-C while running: StopRun
        code = _drive(coordinator, run_id, settings, c.num_rollout, supervisor.check, interrupted)
        return 1 if code == COORDINATOR_CRASHED else code  # a dead actor ends the run (no restart on Ray yet)
    except (RuntimeError, TimeoutError) as exc:
        cause = getattr(exc, "cause", None) or exc  # an actor method's own exception, without Ray's frame
        print(f"run {run_id} could not start on Ray: {cause}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"run {run_id}: interrupted while starting; stopping the actors", file=sys.stderr, flush=True)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
        services.shutdown()
        if started_ray:
            ray.shutdown()


def _init_ray(address: str, specs: list[ActorSpec]) -> None:
    """Join the cluster at `address` (or RAY_ADDRESS); else start a local one that fits the run:
    its logical CPUs are at least one per actor, even on a 2-core laptop."""
    import os

    import ray

    address = address or os.environ.get("RAY_ADDRESS", "")
    if address:
        _check_reachable(address)
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        return
    num_cpus = max(os.cpu_count() or 1, int(sum(s.resources.get("CPU", 0.0) for s in specs)))
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def check_fits(specs: list[ActorSpec], cluster: dict[str, float]) -> None:
    """Refuse at once (rather than wait for placement) when the cluster is too small in total."""
    for resource in ("CPU", "GPU"):
        needed = sum(s.resources.get(resource, 0.0) for s in specs)
        if needed > cluster.get(resource, 0.0):
            raise PlacementError(
                f"the run's actors need {needed:g} {resource} in total and the Ray cluster has "
                f"{cluster.get(resource, 0.0):g}"
            )


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """ConnectionError at once when nothing listens at host:port (ray.init would retry for minutes)."""
    import socket

    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if target == "auto" or not port.isdigit():
        return  # "auto" (a cluster started on this node) or an address form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(
            f"nothing answers at {address} ({exc}); is the Ray head running there?"
        ) from None
