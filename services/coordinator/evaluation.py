"""Held-out evaluation: generate on every eval prompt, report eval/<source> accuracy and pass@k.

Eval prompts come from the dataloader's --eval-prompt-data sources (nothing but the dataloader
reads data files), paged with EvalBatch in file order, so every evaluation sees the same prompts.
"""

from __future__ import annotations

import time

import numpy as np

from rollway.common.v1 import common_pb2
from rollway.coordinator.remote import Services
from rollway.coordinator.rollout_batch import group_samples, to_prompts
from rollway.dataloader.v1 import dataloader_pb2


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


class Evaluator:
    """Runs evaluations of the named eval sources against the rollout services."""

    def __init__(
        self,
        services: Services,
        names: list[str],
        *,
        n_samples: int,
        sampling: common_pb2.SamplingParams,
        reward: str,
        batch_size: int = 256,
    ):
        self.services = services
        self.names = names
        self.n_samples = n_samples
        self.sampling = sampling
        self.reward = reward
        self.batch_size = batch_size

    def _items(self, name: str) -> list[dataloader_pb2.DataItem]:
        items: list[dataloader_pb2.DataItem] = []
        offset = 0
        while True:
            reply = self.services.dataloader.EvalBatch(
                dataloader_pb2.EvalBatchRequest(name=name, offset=offset, batch_size=self.batch_size)
            )
            items.extend(reply.items)
            offset = reply.next_offset
            if reply.done or not reply.items:
                return items

    def evaluate(self, request_id: str) -> dict[str, float]:
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        everything: list[common_pb2.Sample] = []
        for name in self.names:
            prompts = to_prompts(self._items(name), first_group_index=0)
            samples = self.services.generate(
                prompts, self.n_samples, self.sampling, self.reward, f"{request_id}-{name}"
            )
            groups = group_samples(samples)
            correct = [sum(s.raw_reward > 0 for s in g) for g in groups]
            metrics[f"eval/{name}"] = float(np.mean([s.raw_reward for s in samples]))
            for k in sorted({1, self.n_samples}):
                metrics[f"eval/{name}/pass@{k}"] = float(
                    np.mean([pass_at_k(len(g), c, k) for g, c in zip(groups, correct, strict=True)])
                )
            everything += samples
        if everything:
            metrics["eval/accuracy"] = float(np.mean([s.raw_reward > 0 for s in everything]))
        metrics["perf/eval_time"] = time.perf_counter() - start  # the step timeline's eval share
        return metrics
