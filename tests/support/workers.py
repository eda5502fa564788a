"""Which tests share a worker when `make test` runs the suite on parallel workers (pytest-xdist).

Each group runs on one worker, its tests in collection order, and a worker takes the next group when
it is done with one. A test module is a group of its own (its module fixtures start once). Two groups
span modules, found by the module's file name, since the scheduler sees only test ids:
- `ray`: tests/cluster and every module named for Ray (`test_ray_*.py`, `test_*_ray.py`,
  `test_*_ray_*.py`). One Ray instance at a time on the machine: `ray.init()` without an address
  joins the last cluster started here, and each start costs most of a core for ~30 s.
- `sglang`: every module named for SGLang. The shared server pair (tests/conftest.py) must see its
  users one after another, and each server start costs ~1 core for 30-40 s.
tests/conftest.py refuses a test marked `ray`, or on the shared SGLang pair, in a module whose name
puts it elsewhere.

Each worker computes on its own share of the cores (`pin_to_own_cores`), and so does every process
its tests start (they inherit it, and rollway sizes torch's threads by it: common/cpu_threads.py).
Unpinned, two workers' tests each sized their threads for the whole machine and fought over it:
the cluster and SGLang tests side by side took 2-4x their time alone.
"""

from __future__ import annotations

import os
import re

RAY = "ray"
SGLANG = "sglang"
_NAMED_FOR_RAY = re.compile(r"(^|_)ray(_|\.py$)")


def worker_group(nodeid: str) -> str:
    """The group of the test with this id (`tests/e2e/test_x.py::test_y[param]`)."""
    path = nodeid.split("::", 1)[0]
    name = path.rpartition("/")[2]
    if path.startswith("tests/cluster/") or _NAMED_FOR_RAY.search(name):
        return RAY
    if "sglang" in name:
        return SGLANG
    return path


def pin_to_own_cores() -> None:
    """On pytest-xdist worker k of n, run on every n-th usable core from the k-th (worker 0 of 2 on
    a 2-core machine: core 0), with the threads already started; nothing outside a worker, or with
    more workers than cores."""
    worker, count = (
        os.environ.get("PYTEST_XDIST_WORKER"),
        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
    )
    cores = sorted(os.sched_getaffinity(0))
    if not worker or count < 2 or len(cores) < count:
        return
    own = set(cores[int(worker.removeprefix("gw")) % count :: count])
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), own)


def make_scheduler(config, log):
    """pytest-xdist's scheduler for these groups: its loadscope scheduling with `worker_group` as the
    scope (xdist's own `--dist loadgroup` reads `xdist_group` marks, and cannot on pytest 9: it sets
    a node id attribute pytest no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return GroupScheduling(config, log)
