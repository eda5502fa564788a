"""Collecting one rollout batch: prompts from the dataloader, samples from the rollout services.

    dataloader.NextBatch ──> rollout.Generate ──> dynamic sampling (keep_groups) ──┐
         ^  refill (over_sampling_batch_size) while fewer than rollout_batch_size   │
         └──────────────────────── groups survived <────────────────────────────────┘
                                                        ──> advantages ──> Rollout

Or, with --load-debug-rollout-data, the samples saved by an earlier run (replay).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rollway.common.v1 import common_pb2
from rollway.coordinator import debug_data
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.remote import Services
from rollway.coordinator.rollout_batch import (
    assign_advantages,
    group_samples,
    keep_groups,
    rollout_metrics,
    to_prompts,
)
from rollway.coordinator.run_state import RunState

MAX_REFILLS = 16


@dataclass
class Rollout:
    rollout_id: int
    samples: list[common_pb2.Sample]
    metrics: dict[str, float]
    generate_seconds: float


def sampling_params(config: CoordinatorConfig) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(
        temperature=config.rollout_temperature,
        top_p=config.rollout_top_p,
        top_k=config.rollout_top_k,
        max_new_tokens=config.rollout_max_response_len,
        stop=config.rollout_stop,
        seed=config.rollout_seed,
    )


def collect_rollout(
    config: CoordinatorConfig, services: Services, state: RunState, rollout_id: int
) -> Rollout:
    """One rollout: batches of prompts until rollout_batch_size groups survive the filter.

    Advances state.next_batch_id and state.next_group_index by what it consumed."""
    c = config
    start = time.perf_counter()
    if c.load_debug_rollout_data:
        samples = debug_data.load_rollout(c.load_debug_rollout_data, rollout_id)
        return Rollout(rollout_id, samples, rollout_metrics(samples), 0.0)
    kept: list[list[common_pb2.Sample]] = []
    dropped = seen = 0
    for attempt in range(MAX_REFILLS):
        wanted = (
            c.rollout_batch_size
            if attempt == 0
            else max(c.over_sampling_batch_size, c.rollout_batch_size - len(kept))
        )
        batch = services.next_batch(wanted, state.next_batch_id)
        state.next_batch_id += 1
        if not batch.items:
            break
        prompts = to_prompts(batch.items, state.next_group_index)
        state.next_group_index += len(prompts)
        sampling = sampling_params(c)
        # Seeds follow the global group index: a refill draws new samples, a resumed run the same
        # samples as the uninterrupted run would have.
        sampling.seed = c.rollout_seed + prompts[0].group_index * c.n_samples_per_prompt
        samples = services.generate(
            prompts, c.n_samples_per_prompt, sampling, c.rm_type, f"rollout-{rollout_id}"
        )
        groups, num_dropped = keep_groups(group_samples(samples), c.dynamic_sampling_filter_path)
        kept += groups
        dropped += num_dropped
        seen += len(prompts)
        if len(kept) >= c.rollout_batch_size or not c.dynamic_sampling_filter_path:
            break
    kept = kept[: c.rollout_batch_size]  # leftovers beyond the batch are discarded (Miles aborts them)
    if c.train_only is False and len(kept) * c.n_samples_per_prompt < c.global_batch_size:
        raise RuntimeError(
            f"rollout {rollout_id}: only {len(kept)} groups with reward variance after {seen} prompts"
        )
    samples = assign_advantages(
        kept, c.advantage_estimator, disable_grpo_std_normalization=c.disable_grpo_std_normalization
    )
    usable = len(samples) - len(samples) % c.global_batch_size
    metrics = rollout_metrics(samples[:usable], num_dropped_groups=dropped, num_groups=seen)
    return Rollout(rollout_id, samples[:usable], metrics, time.perf_counter() - start)
