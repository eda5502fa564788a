"""Collecting one rollout batch: prompts from the dataloader, samples from the rollout services.

    carried groups (--partial-rollout) ──> rollout.Generate (continuations) ──┐
    dataloader.NextBatch ──> rollout.Generate ──> dynamic sampling, group by group (GroupCollector)
         ^  refill (over_sampling_batch_size) while fewer than       │   enough groups: Abort or
         └──────────── rollout_batch_size groups survived <──────────┘   cancel the leftovers
                                       ──> advantages ──> Rollout; aborted groups ──> carried

Or, with --load-debug-rollout-data, the samples saved by an earlier run (replay).
"""

from __future__ import annotations

import base64
import threading
import time
from dataclasses import dataclass, field

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
from rollway.rollout.v1 import rollout_pb2

MAX_REFILLS = 16


@dataclass
class Rollout:
    rollout_id: int
    samples: list[common_pb2.Sample]
    metrics: dict[str, float]
    generate_seconds: float
    # Dataset positions (source, epoch, row_index) of every prompt fetched for it (prompt_ledger.py).
    prompts: list[tuple[str, int, int]] = field(default_factory=list)


def sampling_params(config: CoordinatorConfig) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(
        temperature=config.rollout_temperature,
        top_p=config.rollout_top_p,
        top_k=config.rollout_top_k,
        max_new_tokens=config.rollout_max_response_len,
        stop=config.rollout_stop,
        seed=config.rollout_seed,
    )


# The response of a FAILED sample that has none: any id in every vocabulary (loss mask 0).
FILLER_TOKEN_ID = 0


class GroupCollector:
    """Samples of one rollout grouped as they stream in; each complete group goes through the
    dynamic-sampling filter at once, so generation can stop as soon as enough groups survived."""

    def __init__(self, n_samples_per_prompt: int, filter_name: str):
        self.n_samples_per_prompt = n_samples_per_prompt
        self.filter_name = filter_name
        self.kept: list[list[common_pb2.Sample]] = []
        self.num_dropped = 0
        self.wanted = 0  # stop once this many groups are kept (0: never stop early)
        self.partial: list[list[common_pb2.Sample]] = []  # complete groups with aborted samples
        self.group_rewards: list[list[float]] = []  # of every group scored (kept or dropped)
        self._open: dict[int, list[common_pb2.Sample]] = {}
        self._lock = threading.Lock()

    @property
    def num_complete(self) -> int:
        return len(self.kept) + self.num_dropped

    def add(self, sample: common_pb2.Sample) -> bool:
        """Take one sample (from any thread); True once `wanted` groups are kept."""
        if sample.finish_reason == common_pb2.FINISH_REASON_FAILED:
            # Its environment failed (reward_error says how): it keeps its place in the group and
            # its reward, but no token of it is trained on.
            if not sample.response_token_ids:
                # It failed before the model's first turn (its environment was unreachable at
                # Reset): one masked filler token, as the trainer takes no empty response.
                sample.response_token_ids.append(FILLER_TOKEN_ID)
                sample.rollout_log_probs.append(0.0)
            sample.loss_mask[:] = [0] * len(sample.response_token_ids)
        with self._lock:
            group = self._open.setdefault(sample.group_index, [])
            group.append(sample)
            if len(group) == self.n_samples_per_prompt:
                del self._open[sample.group_index]
                if any(s.finish_reason == common_pb2.FINISH_REASON_ABORT for s in group):
                    self.partial.append(sorted(group, key=lambda s: s.index))  # not scored as a group
                else:
                    self.group_rewards.append([s.reward for s in group])
                    kept, dropped = keep_groups(group_samples(group), self.filter_name)
                    self.kept += kept
                    self.num_dropped += dropped
            return 0 < self.wanted <= len(self.kept)

    def batch(self, num_groups: int) -> list[list[common_pb2.Sample]]:
        """The first `num_groups` kept groups in group order (the rest are discarded)."""
        return sorted(self.kept, key=lambda g: g[0].group_index)[:num_groups]


def collect_rollout(
    config: CoordinatorConfig, services: Services, state: RunState, rollout_id: int
) -> Rollout:
    """One rollout: batches of prompts until rollout_batch_size groups survive the filter.

    With a filter, a refill stops generating as soon as enough groups survived: the samples still
    generating are aborted (Miles' "abort leftovers"), so which groups of that refill make the
    batch depends on the order they finished in. Advances state.next_batch_id and
    state.next_group_index by what it consumed."""
    c = config
    start = time.perf_counter()
    if c.load_debug_rollout_data:
        samples = debug_data.load_rollout(c.load_debug_rollout_data, rollout_id)
        return Rollout(rollout_id, samples, rollout_metrics(samples), 0.0)
    groups = GroupCollector(c.n_samples_per_prompt, c.dynamic_sampling_filter_path)
    groups.wanted = c.rollout_batch_size if c.dynamic_sampling_filter_path else 0
    num_continued = _continue_partial_groups(c, services, state, groups, rollout_id)
    consumed: list[tuple[str, int, int]] = []
    for attempt in range(MAX_REFILLS):
        missing = c.rollout_batch_size - len(groups.kept)
        if missing <= 0:  # the continued groups filled the batch
            break
        batch = services.next_batch(
            missing if attempt == 0 else (c.over_sampling_batch_size or missing), state.next_batch_id
        )
        state.next_batch_id += 1
        if not batch.items:
            break
        consumed.extend((item.source, item.epoch, item.row_index) for item in batch.items)
        prompts = to_prompts(batch.items, state.next_group_index)
        state.next_group_index += len(prompts)
        sampling = sampling_params(c)
        # Seeds follow the global group index: a refill draws new samples, a resumed run the same
        # samples as the uninterrupted run would have.
        sampling.seed = c.rollout_seed + prompts[0].group_index * c.n_samples_per_prompt
        services.generate(
            prompts,
            c.n_samples_per_prompt,
            sampling,
            c.rm_type,
            f"rollout-{rollout_id}",
            enough=groups.add,
            keep_aborted=c.partial_rollout,
        )
        if len(groups.kept) >= c.rollout_batch_size or not c.dynamic_sampling_filter_path:
            break
    kept = groups.batch(c.rollout_batch_size)
    if c.partial_rollout:
        state.partial_groups = [[encode_sample(s) for s in g] for g in groups.partial]
    if c.train_only is False and len(kept) * c.n_samples_per_prompt < c.global_batch_size:
        raise RuntimeError(
            f"rollout {rollout_id}: only {len(kept)} groups with reward variance after "
            f"{groups.num_complete} complete groups"
        )
    samples = assign_advantages(
        kept,
        c.advantage_estimator,
        disable_grpo_std_normalization=c.disable_grpo_std_normalization,
        disable_rewards_normalization=c.disable_rewards_normalization,
    )
    usable = len(samples) - len(samples) % c.global_batch_size
    metrics = rollout_metrics(
        samples[:usable], num_dropped_groups=groups.num_dropped, group_rewards=groups.group_rewards
    )
    if c.partial_rollout:
        metrics["rollout/partial/continued_samples"] = float(num_continued)
        metrics["rollout/partial/carried_groups"] = float(len(state.partial_groups))
    return Rollout(rollout_id, samples[:usable], metrics, time.perf_counter() - start, consumed)


# --- partial rollout (--partial-rollout) ---------------------------------------------------------
def encode_sample(sample: common_pb2.Sample) -> str:
    return base64.b64encode(sample.SerializeToString()).decode("ascii")


def decode_sample(text: str) -> common_pb2.Sample:
    return common_pb2.Sample.FromString(base64.b64decode(text))


def _continue_partial_groups(
    config: CoordinatorConfig, services: Services, state: RunState, groups: GroupCollector, rollout_id: int
) -> int:
    """Continue the groups the previous rollout aborted (state.partial_groups), before any new
    prompt: finished samples are kept as they are, each aborted one resumes after its partial
    response (rollout.Prompt.response_prefix; one aborted before its first token starts over).
    A continued sample keeps its index and its weight_version (that of its oldest tokens, so
    staleness is not understated); with --mask-offpolicy-in-partial-rollout its earlier tokens
    are loss-masked. Returns the number of samples continued."""
    if not state.partial_groups:
        return 0
    carried = [[decode_sample(text) for text in group] for group in state.partial_groups]
    state.partial_groups = []
    originals: list[common_pb2.Sample] = []
    prompts: list[rollout_pb2.Prompt] = []
    for group in carried:
        for sample in group:
            if sample.finish_reason != common_pb2.FINISH_REASON_ABORT:
                groups.add(sample)
                continue
            prompt = rollout_pb2.Prompt(
                token_ids=sample.prompt_token_ids,
                label=sample.label,
                source=sample.source,
                group_index=sample.group_index,
                response_prefix=rollout_pb2.ResponsePrefix(
                    token_ids=sample.response_token_ids,
                    log_probs=sample.rollout_log_probs,
                    # An episode resumes mid-turn with its environment tokens still masked.
                    loss_mask=sample.loss_mask if sample.turns else [],
                    turns=sample.turns,
                ),
            )
            if sample.HasField("metadata"):
                prompt.metadata.CopyFrom(sample.metadata)
            originals.append(sample)
            prompts.append(prompt)

    def continued(sample: common_pb2.Sample) -> bool:
        # One sample per prompt: its index in the request (remote.py numbers it across every
        # rollout service) is the position of the aborted sample it continues.
        original = originals[sample.index]
        if original.group_index != sample.group_index:
            raise RuntimeError(
                f"continued sample {sample.index} of group {sample.group_index} does not match the "
                f"aborted sample it continues (group {original.group_index})"
            )
        num_old = len(original.response_token_ids)
        sample.index, sample.weight_version = original.index, original.weight_version
        if config.mask_offpolicy_in_partial_rollout:
            new_mask = list(sample.loss_mask[num_old:])  # an episode's environment tokens stay 0
            del sample.loss_mask[:]
            sample.loss_mask.extend([0] * num_old + new_mask)
        return groups.add(sample)

    sampling = sampling_params(config)
    # Reproducible from the run seed, the data position and the rollout id (a resumed run draws
    # the same continuations).
    sampling.seed = config.rollout_seed + state.next_group_index * config.n_samples_per_prompt + rollout_id
    services.generate(
        prompts,
        1,
        sampling,
        config.rm_type,
        f"rollout-{rollout_id}-continued",
        enough=continued,
        keep_aborted=True,
    )
    return len(prompts)
