"""make test's worker groups (tests/support/workers.py): a module is a group, except the Ray and the
SGLang modules, which share one each."""

from __future__ import annotations

import pytest
from support.workers import RAY, SGLANG, worker_group


@pytest.mark.parametrize(
    ("nodeid", "group"),
    [
        ("tests/cluster/test_sft_cluster.py::test_x", RAY),
        ("tests/cluster/test_netns_network.py::test_y[a::b]", RAY),
        ("tests/e2e/test_ray_launcher.py::test_x", RAY),
        ("tests/e2e/test_tinker_ray.py::test_x", RAY),
        ("tests/integration/test_deploy_ray_placement.py::test_x", RAY),
        ("tests/e2e/test_sglang_grpo.py::test_x", SGLANG),
        ("tests/realmodel/test_smollm2_sglang.py::test_x", SGLANG),
        ("tests/integration/test_sglang_weight_sync.py::test_x[0.5.20]", SGLANG),
        ("tests/e2e/test_rl_run.py::test_x", "tests/e2e/test_rl_run.py"),
        ("tests/unit/test_array_rays.py::test_x", "tests/unit/test_array_rays.py"),  # not named for Ray
        ("tests/unit/trainer/test_xray.py::test_x", "tests/unit/trainer/test_xray.py"),
    ],
)
def test_a_module_is_its_own_group_unless_named_for_ray_or_sglang(nodeid, group):
    assert worker_group(nodeid) == group
