"""Check the datums of a ForwardBackward request and turn them into SequenceItems (rank 0).

A datum's targets are its inputs shifted by one, so it is one sequence: token_ids plus the last
target, whose first token is the "prompt" and whose other tokens are all "response" (every
position is predicted and carries the per-token inputs). Every problem raises InvalidArgument
naming the field, e.g. `data[2].weights: has 5 entries for 6 targets`.
"""

from __future__ import annotations

import math

from rollway.common.errors import InvalidArgument
from rollway.trainer.loss.datum_losses import DATUM_LOSSES, DatumLoss
from rollway.trainer.micro_batch import SequenceItem


def datum_loss(loss_fn: str, loss_fn_config: dict[str, float]) -> DatumLoss:
    """The named loss, its settings checked."""
    spec = DATUM_LOSSES.get(loss_fn)
    if spec is None:
        raise InvalidArgument("loss_fn", f"unknown loss {loss_fn!r}; one of {sorted(DATUM_LOSSES)}")
    for name, value in loss_fn_config.items():
        if name not in spec.settings:
            raise InvalidArgument(
                f"loss_fn_config.{name}", f"{loss_fn} takes no such setting (it takes {list(spec.settings)})"
            )
        if not math.isfinite(value) or value < 0:
            raise InvalidArgument(f"loss_fn_config.{name}", f"must be a finite number >= 0 (got {value})")
    return spec


def to_datum_item(datum, position: int, spec: DatumLoss, vocab_size: int) -> SequenceItem:
    """One Datum -> SequenceItem; `position` is its index in the request."""
    field = f"data[{position}]"
    tokens, targets = list(datum.token_ids), list(datum.target_token_ids)
    if not tokens:
        raise InvalidArgument(f"{field}.token_ids", "must not be empty")
    if len(targets) != len(tokens):
        raise InvalidArgument(
            f"{field}.target_token_ids", f"has {len(targets)} entries for {len(tokens)} input tokens"
        )
    if targets[:-1] != tokens[1:]:
        first = next(i for i, (t, n) in enumerate(zip(targets, tokens[1:], strict=False)) if t != n)
        raise InvalidArgument(
            f"{field}.target_token_ids",
            f"must be the inputs shifted by one: target {first} is {targets[first]}, "
            f"input {first + 1} is {tokens[first + 1]}",
        )
    for name, ids in (("token_ids", tokens), ("target_token_ids", targets)):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidArgument(
                f"{field}.{name}", f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})"
            )
    extras = {}
    for name in spec.inputs:
        values = list(getattr(datum, name))
        if len(values) != len(targets):
            raise InvalidArgument(f"{field}.{name}", f"has {len(values)} entries for {len(targets)} targets")
        if not all(math.isfinite(v) for v in values):
            raise InvalidArgument(f"{field}.{name}", "entries must be finite numbers")
        extras[name] = values
    return SequenceItem(
        index=position,
        token_ids=tokens + targets[-1:],
        response_start=1,
        loss_mask=[1] * len(targets),
        extras=extras,
    )


def to_datum_items(data, spec: DatumLoss, vocab_size: int) -> list[SequenceItem]:
    """All datums of a request, in order; an empty batch is refused."""
    if len(data) == 0:
        raise InvalidArgument("data", "empty batch: at least one datum is needed")
    return [to_datum_item(datum, position, spec, vocab_size) for position, datum in enumerate(data)]
