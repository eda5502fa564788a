"""Held-out evaluation: generate on every eval prompt, report eval/<source> accuracy and pass@k.

Eval prompts come from the dataloader's --eval-prompt-data sources (nothing but the dataloader
reads data files), paged with EvalBatch in file order, so every evaluation sees the same prompts.

    EvalBatch (a page of eval_batch_size prompts) ──> Generate ──> samples ──> eval/<source>
         ^  the next page while this one generates              (EVAL_PAGES_IN_FLIGHT at once)
         └── until the source is done

Each page is one Generate: a 200-prompt eval set in one call put every sample in the engine at
once, 2.7x the rollout service's memory the plan predicts from a rollout's samples (#37). Pages
keep eval inside it: by default the pages in flight hold a rollout's samples together. Two pages
at once, so the next page's rows join the engine's batch as the current page's rows finish.
A page starting at row `offset` is seeded seed + offset * n_samples, as that part of one
whole-set request would be: paging does not change what a seeded eval samples.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from rollway.common.tracing import in_current_context
from rollway.common.v1 import common_pb2
from rollway.coordinator.config import EVAL_PAGES_IN_FLIGHT
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
        prompts_per_generate: int,
    ):
        self.services = services
        self.names = names
        self.n_samples = n_samples
        self.sampling = sampling
        self.reward = reward
        self.prompts_per_generate = prompts_per_generate

    def _generate_all(self, name: str, request_id: str) -> list[common_pb2.Sample]:
        """Every sample of source `name`: one Generate per page of eval prompts, EVAL_PAGES_IN_FLIGHT
        at once (the next page's rows join the engine's batch as the current page's finish)."""
        samples: list[common_pb2.Sample] = []
        in_flight: deque[Future] = deque()
        with ThreadPoolExecutor(EVAL_PAGES_IN_FLIGHT, thread_name_prefix="eval") as pool:
            offset = 0
            while True:
                reply = self.services.dataloader.EvalBatch(
                    dataloader_pb2.EvalBatchRequest(
                        name=name, offset=offset, batch_size=self.prompts_per_generate
                    )
                )
                if reply.items:
                    if len(in_flight) == EVAL_PAGES_IN_FLIGHT:
                        samples += in_flight.popleft().result()
                    page = functools.partial(self._generate_page, reply.items, offset, f"{request_id}-{name}")
                    in_flight.append(pool.submit(in_current_context(page)))
                if reply.done or not reply.items:
                    break
                offset = reply.next_offset
            for page in in_flight:
                samples += page.result()
        return samples

    def _generate_page(self, items, offset: int, request_id: str) -> list[common_pb2.Sample]:
        sampling = common_pb2.SamplingParams()
        sampling.CopyFrom(self.sampling)
        if sampling.HasField("seed"):
            sampling.seed += offset * self.n_samples
        prompts = to_prompts(items, first_group_index=offset)
        return self.services.generate(
            prompts, self.n_samples, sampling, self.reward, f"{request_id}-{offset}"
        )

    def evaluate(self, request_id: str) -> dict[str, float]:
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        everything: list[common_pb2.Sample] = []
        for name in self.names:
            samples = self._generate_all(name, request_id)
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
        # Apart from perf/step_time (run.py): the progress line's pace and ETA count them apart.
        metrics["perf/eval_time"] = time.perf_counter() - start
        return metrics
