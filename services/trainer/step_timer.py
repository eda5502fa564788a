"""Where a training step's time goes, as perf/<phase>_time metrics (rank 0's view).

    data          build micro-batch tensors (and plan them, on rank 0's controller)
    log_probs     no-grad forward of the old policy before the first update (engine.fill_policy_inputs)
    ref_log_probs no-grad forward of the reference model
    forward       model forward, log-softmax and loss terms of the training micro-batches
    backward      autograd backward, FSDP2 reduce-scatter included
    optimizer     gradient clipping, AdamW step, zeroing the gradients

Phases never overlap, so their sum is at most the step's time; what is left of
perf/actor_train_time is Python overhead and metric bookkeeping. On CUDA a phase ends with a
synchronize so that the asynchronous kernels are charged to the phase that launched them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

PHASES = ("data", "log_probs", "ref_log_probs", "forward", "backward", "optimizer")


class StepTimer:
    """Seconds per phase, summed over the micro-batches of one or more optimizer steps."""

    def __init__(self, device: torch.device):
        self.sync = device.type == "cuda"
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - started

    def metrics(self) -> dict[str, float]:
        return {f"perf/{name}_time": seconds for name, seconds in self.seconds.items()}
