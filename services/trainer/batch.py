"""Check the samples of a request and turn them into SequenceItems (rank 0, before any rank works).

Every problem raises InvalidArgument naming the field, e.g. `samples[3].loss_mask: has 5 entries
for 6 response tokens`. A batch that passes here cannot make a rank fail on its content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from rollway.common.errors import InvalidArgument
from rollway.trainer.micro_batch import SequenceItem

if TYPE_CHECKING:
    from rollway.trainer.config import TrainerConfig


def _check_ids(field: str, ids: np.ndarray, vocab_size: int) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
        raise InvalidArgument(field, f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def to_item(
    sample,
    position: int,
    *,
    vocab_size: int,
    with_loss_mask: bool,
    per_token_inputs: Sequence[str] = (),
    require_prompt: bool = False,
) -> SequenceItem:
    """One common.v1.Sample -> SequenceItem; `position` is its index in the request."""
    field = f"samples[{position}]"
    prompt = np.asarray(sample.prompt_token_ids, dtype=np.int64)
    response = np.asarray(sample.response_token_ids, dtype=np.int64)
    if response.size == 0:
        raise InvalidArgument(f"{field}.response_token_ids", "must not be empty")
    if require_prompt and prompt.size == 0:
        raise InvalidArgument(
            f"{field}.prompt_token_ids",
            "must not be empty (the first response token needs a token before it)",
        )
    _check_ids(f"{field}.prompt_token_ids", prompt, vocab_size)
    _check_ids(f"{field}.response_token_ids", response, vocab_size)
    loss_mask: list[int] = [1] * response.size
    if with_loss_mask:
        loss_mask = list(sample.loss_mask)
        if len(loss_mask) != response.size:
            raise InvalidArgument(
                f"{field}.loss_mask", f"has {len(loss_mask)} entries for {response.size} response tokens"
            )
        if any(v not in (0, 1) for v in loss_mask):
            raise InvalidArgument(f"{field}.loss_mask", "entries must be 0 or 1")
    extras = {}
    for name in per_token_inputs:
        values = list(getattr(sample, name))
        if len(values) != response.size:
            raise InvalidArgument(
                f"{field}.{name}", f"has {len(values)} entries for {response.size} response tokens"
            )
        if not np.all(np.isfinite(values)):
            raise InvalidArgument(f"{field}.{name}", "entries must be finite numbers")
        extras[name] = values
    return SequenceItem(
        index=position,
        token_ids=prompt.tolist() + response.tolist(),
        response_start=int(prompt.size),
        loss_mask=loss_mask,
        extras=extras,
        source=sample.source,
    )


def sample_fields(samples: Sequence, settings: TrainerConfig) -> tuple[str, ...]:
    """Per-token Sample fields policy_loss reads: advantages, and rollout_log_probs when the
    samples carry them (all or none; required by --use-tis and --use-rollout-logprobs)."""
    present = [len(sample.rollout_log_probs) > 0 for sample in samples]
    needing = ("use_tis", "use_mis", "use_geo_mask", "use_rollout_logprobs")
    required = next((name for name in needing if getattr(settings, name)), "")
    if not any(present):
        if required and samples:
            raise InvalidArgument("samples[0].rollout_log_probs", f"required with {required}")
        return ("advantages",)
    if not all(present):
        missing = present.index(False)
        raise InvalidArgument(
            f"samples[{missing}].rollout_log_probs",
            "missing while other samples carry them: send all or none",
        )
    return ("advantages", "rollout_log_probs")


def to_items(samples, **kwargs) -> list[SequenceItem]:
    """All samples of a request, in order; an empty batch is refused."""
    if len(samples) == 0:
        raise InvalidArgument("samples", "empty batch: at least one sample is needed")
    return [to_item(sample, position, **kwargs) for position, sample in enumerate(samples)]


def num_loss_tokens(item: SequenceItem) -> int:
    """Loss tokens that have a prediction (with no prompt the first token has none)."""
    skip = 1 if item.response_start == 0 else 0
    return int(sum(item.loss_mask[skip:]))
