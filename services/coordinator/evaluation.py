"""Held-out evaluation: generate on every eval prompt, report eval/<source> accuracy and pass@k.

Eval prompts come from a dataloader of their own (nothing but the dataloader reads data files).
Its cursor is captured once and restored before each evaluation, so every evaluation sees the
same prompts in the same order.
"""

from __future__ import annotations

from collections import defaultdict

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
    """Runs evaluations against an eval dataloader and the rollout services."""

    def __init__(
        self,
        eval_services: Services,
        services: Services,
        *,
        n_samples: int,
        sampling: common_pb2.SamplingParams,
        reward: str,
        batch_size: int = 64,
    ):
        self.eval_services = eval_services
        self.services = services
        self.n_samples = n_samples
        self.sampling = sampling
        self.reward = reward
        self.batch_size = batch_size
        self._initial_cursor = eval_services.dataloader.GetState(dataloader_pb2.GetStateRequest()).state_json
        self._batch_id = 0

    def _items(self) -> list[dataloader_pb2.DataItem]:
        self.eval_services.dataloader.RestoreState(
            dataloader_pb2.RestoreStateRequest(state_json=self._initial_cursor)
        )
        items: list[dataloader_pb2.DataItem] = []
        while True:
            reply = self.eval_services.next_batch(self.batch_size, 1_000_000_000 + self._batch_id)
            self._batch_id += 1
            items.extend(reply.items)
            if reply.exhausted or not reply.items:
                return items

    def evaluate(self, request_id: str) -> dict[str, float]:
        items = self._items()
        prompts = to_prompts(items, first_group_index=0)
        samples = self.services.generate(prompts, self.n_samples, self.sampling, self.reward, request_id)
        per_source: dict[str, list[list[common_pb2.Sample]]] = defaultdict(list)
        for group in group_samples(samples):
            per_source[group[0].source].append(group)
        metrics: dict[str, float] = {}
        for source, groups in per_source.items():
            correct = [sum(s.raw_reward > 0 for s in g) for g in groups]
            metrics[f"eval/{source}"] = float(np.mean([s.raw_reward for g in groups for s in g]))
            for k in sorted({1, self.n_samples}):
                metrics[f"eval/{source}/pass@{k}"] = float(
                    np.mean([pass_at_k(len(g), c, k) for g, c in zip(groups, correct, strict=True)])
                )
        all_samples = [s for groups in per_source.values() for g in groups for s in g]
        if all_samples:
            metrics["eval/accuracy"] = float(np.mean([s.raw_reward > 0 for s in all_samples]))
            metrics["eval/num_prompts"] = float(len(items))
        return metrics
