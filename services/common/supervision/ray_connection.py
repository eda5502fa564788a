"""This process's connection to Ray, shared by the RayServiceGroups of concurrent runs.

    group A .start ─ join_ray(address) ─ ray.init (first user: join the cluster, or start a local one)
    group B .start ─ join_ray(address) ─ already joined: the same cluster, or RayStartError
    group A .stop  ─ leave_ray()         one user fewer
    group B .stop  ─ leave_ray()         the last user: ray.shutdown(), if this process started it

Ray allows one connection per process, so it is counted here, apart from any one group: a run that
ends must not cut off the runs still going, and a caller that initialised Ray itself keeps it.
"""

from __future__ import annotations

import os
import threading

from rollway.common.supervision.ray_cluster import head_problem, join_failure_hint


class RayStartError(RuntimeError):
    """The run's services could not be placed or started on Ray; the message says why."""


_ray_lock = threading.Lock()
_ray_users = 0
_ray_ours = False  # initialised here (not by a caller of this process): shut down after the last group


def join_ray(address: str, num_cpus: int) -> None:
    """Join the cluster at `address` (or RAY_ADDRESS); else start a local one that fits the run:
    its logical CPUs are at least one per actor, even on a 2-core laptop."""
    global _ray_users, _ray_ours
    import ray

    with _ray_lock:
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS", "")
            try:
                if address:
                    problem = head_problem(address, timeout_s=10.0)
                    if problem:
                        raise ConnectionError(problem)
                    ray.init(address=address, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(num_cpus=max(os.cpu_count() or 1, num_cpus), include_dashboard=False,
                             log_to_driver=False)  # fmt: skip
            except ConnectionError as exc:
                raise RayStartError(
                    f"cannot reach the Ray cluster: {exc}{join_failure_hint(address)}"
                ) from None
            _ray_ours = True
        elif address and ":" in address and not address.startswith("ray://"):
            joined = ray.get_runtime_context().gcs_address
            if address != joined:
                raise RayStartError(
                    f"ray_address {address}: this coordinator is already joined to the Ray cluster at "
                    f"{joined} (one cluster per coordinator process)"
                )
        _ray_users += 1


def leave_ray() -> None:
    """One group fewer uses Ray; after the last, shut down a Ray that join_ray started."""
    global _ray_users, _ray_ours
    import ray

    with _ray_lock:
        _ray_users -= 1
        if _ray_users == 0 and _ray_ours:
            ray.shutdown()
            _ray_ours = False
