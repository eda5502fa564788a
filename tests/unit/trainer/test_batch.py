"""Request samples -> SequenceItems, and every bad field named."""

from __future__ import annotations

import pytest

from rollway.common.errors import InvalidArgument
from rollway.common.v1 import common_pb2
from rollway.trainer.batch import num_loss_tokens, to_item, to_items


def sample(**kw) -> common_pb2.Sample:
    fields = {"prompt_token_ids": [1, 2], "response_token_ids": [3, 4, 5], "loss_mask": [1, 1, 0]}
    fields.update(kw)
    return common_pb2.Sample(**fields)


def test_prompt_and_response_become_one_sequence():
    item = to_item(sample(), 4, vocab_size=10, with_loss_mask=True)
    assert (item.index, item.token_ids, item.response_start, item.loss_mask) == (
        4,
        [1, 2, 3, 4, 5],
        2,
        [1, 1, 0],
    )
    sft = to_item(sample(prompt_token_ids=[]), 0, vocab_size=10, with_loss_mask=True)
    assert num_loss_tokens(sft) == 1  # the first token of a prompt-less sample has no prediction


@pytest.mark.parametrize(
    "fields, kwargs, message",
    [
        (
            {"response_token_ids": [3, 99, 5]},
            {},
            r"samples\[0\]\.response_token_ids: token id 99 is outside the vocabulary \[0, 10\)",
        ),
        ({"prompt_token_ids": [-1]}, {}, r"samples\[0\]\.prompt_token_ids: token id -1"),
        ({"loss_mask": [1, 1]}, {}, r"samples\[0\]\.loss_mask: has 2 entries for 3 response tokens"),
        ({"loss_mask": [1, 2, 0]}, {}, r"samples\[0\]\.loss_mask: entries must be 0 or 1"),
        (
            {"response_token_ids": [], "loss_mask": []},
            {},
            r"samples\[0\]\.response_token_ids: must not be empty",
        ),
        (
            {"prompt_token_ids": []},
            {"require_prompt": True},
            r"samples\[0\]\.prompt_token_ids: must not be empty",
        ),
        (
            {"advantages": [1.0]},
            {"per_token_inputs": ("advantages",)},
            r"samples\[0\]\.advantages: has 1 entries",
        ),
    ],
)
def test_bad_samples_name_the_field(fields, kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        to_item(sample(**fields), 0, vocab_size=10, with_loss_mask=True, **kwargs)


def test_empty_batch_is_refused():
    with pytest.raises(InvalidArgument, match="samples: empty batch"):
        to_items([], vocab_size=10, with_loss_mask=True)
