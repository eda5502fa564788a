"""How many threads torch computes with on CPU (the trainer's ranks, the CPU rollout engine).

torch's intra-op thread count is a process setting. A service computes with
`cpu_threads` threads, or by default with its share of the cores this process may run on (its
CPU affinity, which is what a container or `taskset` grants): a trainer rank gets the cores
divided by the ranks on the machine, the CPU rollout engine all of them. The trainer and the
rollout engine of one machine take turns in a synchronous RL loop and the trainer computes alone
in SFT, so each gets the whole machine while it works.

Idle OpenMP threads must sleep, not spin: with two services that each hold N threads on N
cores (an async run, or other work on the machine), spinning threads steal the cores their
peers need and a step was measured up to 100x slower. Launchers therefore start every service
with OMP_WAIT_POLICY=PASSIVE (PASSIVE_WAIT_ENV), which the OpenMP runtime reads at start-up.

Results can differ in the last bits between thread counts (a reduction splits differently), so
set `cpu_threads` to the same value on every machine when runs must match bit for bit across them.
"""

from __future__ import annotations

import os

PASSIVE_WAIT_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_cpu_threads(setting: int, sharers: int = 1) -> int:
    """`setting` when positive, else this process's share of the usable cores (at least 1)."""
    if setting > 0:
        return setting
    return max(1, usable_cores() // max(1, sharers))


def apply_cpu_threads(setting: int, sharers: int = 1) -> int:
    """Set torch's intra-op thread count (resolve_cpu_threads); returns it."""
    import torch

    threads = resolve_cpu_threads(setting, sharers)
    torch.set_num_threads(threads)
    return threads
