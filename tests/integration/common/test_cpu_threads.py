"""CPU thread counts: a set value is used as is; the default is the process's share of the cores
it may run on (its affinity), never 0; services start with sleeping idle OpenMP threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rollway.common.config import ConfigError, from_dict
from rollway.common.cpu_threads import PASSIVE_WAIT_ENV, resolve_cpu_threads, usable_cores
from rollway.common.supervision.service_process import ServiceProcess
from rollway.rollout.config import RolloutConfig
from rollway.trainer.config import TrainerConfig


def test_a_set_count_is_used_and_the_default_shares_the_usable_cores():
    cores = usable_cores()
    assert cores == len(os.sched_getaffinity(0))
    assert resolve_cpu_threads(3) == 3
    assert resolve_cpu_threads(3, sharers=4) == 3  # a set count is per rank already
    assert resolve_cpu_threads(0) == cores
    assert resolve_cpu_threads(0, sharers=2) == max(1, cores // 2)
    assert resolve_cpu_threads(0, sharers=cores + 1) == 1  # more ranks than cores: one each


def test_the_default_follows_the_affinity_the_process_was_given():
    # A process pinned to one core (as `taskset -c 0` or a 1-CPU container pins it) computes on one.
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "from rollway.common.cpu_threads import apply_cpu_threads; import torch;"
        "print(apply_cpu_threads(0), torch.get_num_threads(), apply_cpu_threads(2), torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1", "2", "2"]


def test_services_start_with_passive_openmp_waits_unless_the_user_chose():
    service = ServiceProcess("trainer", [], "/tmp")
    assert service.env["OMP_WAIT_POLICY"] == PASSIVE_WAIT_ENV["OMP_WAIT_POLICY"] == "PASSIVE"
    assert service.env["OMP_NUM_THREADS"] == "1"  # services that compute set their own count
    os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    try:
        assert ServiceProcess("trainer", [], "/tmp").env["OMP_WAIT_POLICY"] == "ACTIVE"
    finally:
        del os.environ["OMP_WAIT_POLICY"]


@pytest.mark.parametrize("config_class", [TrainerConfig, RolloutConfig])
def test_a_negative_thread_count_is_refused_by_name(config_class):
    with pytest.raises(ConfigError, match="cpu_threads"):
        from_dict(config_class, {"hf_checkpoint": "/nonexistent", "cpu_threads": -1}).validate()
