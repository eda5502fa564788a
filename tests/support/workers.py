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
"""

from __future__ import annotations

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


def make_scheduler(config, log):
    """pytest-xdist's scheduler for these groups: its loadscope scheduling with `worker_group` as the
    scope (xdist's own `--dist loadgroup` reads `xdist_group` marks, and cannot on pytest 9: it sets
    a node id attribute pytest no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return GroupScheduling(config, log)
