"""What the coordinator does to a rollout between generation and training (pure functions).

dataloader items --to_prompts--> rollout.Generate --> samples
    --keep_groups (dynamic sampling)--> --assign_advantages--> trainer.TrainStep
rollout_metrics() summarises the samples with Miles' metric names.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rollway.common.advantages import sequence_advantages, zero_std_groups
from rollway.common.v1 import common_pb2
from rollway.dataloader.v1 import dataloader_pb2
from rollway.rollout.v1 import rollout_pb2


def to_prompts(items: Sequence[dataloader_pb2.DataItem], first_group_index: int) -> list[rollout_pb2.Prompt]:
    """One Prompt per item; group indices are global so samples of different refills never collide."""
    prompts = []
    for offset, item in enumerate(items):
        prompt = rollout_pb2.Prompt(
            token_ids=item.prompt_token_ids,
            label=item.label,
            source=item.source,
            group_index=first_group_index + offset,
        )
        prompt.metadata.CopyFrom(item.metadata)
        prompts.append(prompt)
    return prompts


def group_samples(samples: Sequence[common_pb2.Sample]) -> list[list[common_pb2.Sample]]:
    """Samples grouped by group_index, groups in index order, samples in index order."""
    groups: dict[int, list[common_pb2.Sample]] = {}
    for sample in sorted(samples, key=lambda s: (s.group_index, s.index)):
        groups.setdefault(sample.group_index, []).append(sample)
    return list(groups.values())


def keep_groups(
    groups: list[list[common_pb2.Sample]], filter_name: str
) -> tuple[list[list[common_pb2.Sample]], int]:
    """Apply the dynamic-sampling filter; returns the kept groups and how many were dropped."""
    if not filter_name:
        return groups, 0
    if filter_name != "check_reward_nonzero_std":
        raise ValueError(f"unknown dynamic sampling filter {filter_name!r}")
    kept = [g for g in groups if len(g) > 1 and not zero_std_groups([s.reward for s in g], len(g))[0]]
    return kept, len(groups) - len(kept)


def assign_advantages(
    groups: list[list[common_pb2.Sample]], estimator: str, **normalization: bool
) -> list[common_pb2.Sample]:
    """Fill each sample's per-token advantages (the sequence advantage on every response token)."""
    samples = [s for g in groups for s in g]
    if not samples:
        return []
    group_size = len(groups[0])
    if any(len(g) != group_size for g in groups):
        raise ValueError("every group must have n_samples_per_prompt samples")
    advantages = sequence_advantages(
        estimator,
        [s.reward for s in samples],
        group_size,
        **normalization,  # disable_grpo_std_normalization, disable_rewards_normalization
    )
    for sample, advantage in zip(samples, advantages, strict=True):
        del sample.advantages[:]
        sample.advantages.extend([float(advantage)] * len(sample.response_token_ids))
    return samples


def zero_std_metrics(group_rewards: Sequence[Sequence[float]]) -> dict[str, float]:
    """Groups whose rewards are all equal (no GRPO signal), as Miles reports them:
    rollout/zero_std/count_<reward> (rounded to 0.1) per reward value, and
    rollout/zero_std/ratio, their fraction of all groups scored in the rollout."""
    if not group_rewards:
        return {}
    zero_std = [g for g in group_rewards if all(r == g[0] for r in g)]
    metrics = {"rollout/zero_std/ratio": len(zero_std) / len(group_rewards)}
    for group in zero_std:
        key = f"rollout/zero_std/count_{round(float(group[0]), 1)}"
        metrics[key] = metrics.get(key, 0.0) + 1.0
    return metrics


def rollout_metrics(
    samples: Sequence[common_pb2.Sample],
    *,
    num_dropped_groups: int = 0,
    group_rewards: Sequence[Sequence[float]] | None = None,
) -> dict[str, float]:
    """rollout/* metrics of one rollout (Miles' names). `group_rewards`: the rewards of every
    group scored in the rollout, those a filter dropped included (default: the samples' groups)."""
    if not samples:
        return {}
    raw = np.array([s.raw_reward for s in samples])
    rewards = np.array([s.reward for s in samples])
    lengths = np.array([len(s.response_token_ids) for s in samples])
    versions = np.array([s.weight_version for s in samples])
    metrics = {
        "rollout/raw_reward": float(raw.mean()),
        "rollout/rewards": float(rewards.mean()),
        "rollout/response_len/mean": float(lengths.mean()),
        "rollout/response_len/max": float(lengths.max()),
        "rollout/response_len/min": float(lengths.min()),
        "rollout/truncated_ratio": float(
            np.mean([s.finish_reason == common_pb2.FINISH_REASON_LENGTH for s in samples])
        ),
        "rollout/weight_version/mean": float(versions.mean()),
        "rollout/weight_version/min": float(versions.min()),
        "rollout/reward_errors": float(sum(bool(s.reward_error) for s in samples)),
        "rollout/num_samples": float(len(samples)),
    }
    if any(s.advantages for s in samples):
        metrics["rollout/advantages"] = float(
            np.mean([np.mean(s.advantages) for s in samples if s.advantages])
        )
    if group_rewards is None:
        group_rewards = [[s.reward for s in g] for g in group_samples(samples)]
    metrics.update(zero_std_metrics(group_rewards))
    metrics["rollout/zero_std/dropped_groups"] = float(num_dropped_groups)
    by_source: dict[str, list[float]] = {}
    for s in samples:
        by_source.setdefault(s.source, []).append(s.raw_reward)
    if len(by_source) > 1:
        for source, values in by_source.items():
            metrics[f"rollout/raw_reward/{source}"] = float(np.mean(values))
    metrics.update(environment_metrics(samples))
    return metrics


def environment_metrics(samples: Sequence[common_pb2.Sample]) -> dict[str, float]:
    """rollout/env/<name>: the mean of each metric environments reported (Sample.metrics), over the
    samples that report it (an episode that failed before scoring reports none, and does not
    count as a zero)."""
    values: dict[str, list[float]] = {}
    for s in samples:
        for name, value in s.metrics.items():
            values.setdefault(name, []).append(value)
    return {f"rollout/env/{name}": float(np.mean(v)) for name, v in sorted(values.items())}
