"""Model inputs of a micro-batch: positions restart per sample, targets and masks line up, and
only the positions that predict a response token are kept as targets."""

from __future__ import annotations

import pytest

from rollway.trainer.micro_batch import SequenceItem, build_micro_batch, row_tokens

A = SequenceItem(3, [10, 11, 12, 13, 14], 2, [1, 0, 1], {"advantages": [0.5, 0.6, 0.7]})
B = SequenceItem(7, [20, 21, 22], 0, [1, 1, 1], {"advantages": [1.0, 2.0, 3.0]})
# Two samples of one prompt [30, 31] (a GRPO group) and one of another.
G1 = SequenceItem(0, [30, 31, 40, 41, 42], 2, [1, 1, 0], {"advantages": [1.0, 1.0, 1.0]})
G2 = SequenceItem(1, [30, 31, 50, 51], 2, [1, 1], {"advantages": [-1.0, -1.0]})
H = SequenceItem(2, [60, 61, 70], 2, [1], {"advantages": [0.5]})


def test_packed_row_layout():
    mb = build_micro_batch([A, B], packing=True, pad_multiple=4, pad_token_id=0, extra_names=("advantages",))
    assert mb.packed and mb.input_ids.shape == (1, 8)
    assert mb.input_ids[0].tolist() == [10, 11, 12, 13, 14, 20, 21, 22]
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert mb.segment_ids[0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert mb.segment_parents.tolist() == [-1, -1]
    # A's response tokens 12, 13, 14 are predicted at positions 1, 2, 3; B has no prompt, so its
    # first response token has no prediction and 21, 22 are predicted at positions 5, 6.
    assert mb.logit_columns.tolist() == [1, 2, 3, 5, 6]
    assert mb.target_ids[0].tolist() == [12, 13, 14, 21, 22]
    assert mb.sample_index[0].tolist() == [3, 3, 3, 7, 7]
    assert mb.loss_mask[0].tolist() == [1, 0, 1, 1, 1]
    assert mb.extras["advantages"][0].tolist() == pytest.approx([0.5, 0.6, 0.7, 2.0, 3.0])
    assert mb.spans == [(3, 0, 0, 3), (7, 0, 3, 5)]
    assert mb.num_tokens == 8


def test_packed_row_is_padded_to_the_multiple():
    mb = build_micro_batch([A, B], packing=True, pad_multiple=16, pad_token_id=0)
    assert mb.input_ids.shape == (1, 16)
    assert mb.segment_ids[0, 8:].tolist() == [-1] * 8
    assert mb.logit_columns.max() < 8  # no logits on padding


def test_padded_layout_has_one_row_per_sample():
    mb = build_micro_batch([A, B], packing=False, pad_multiple=16, pad_token_id=0)
    assert not mb.packed and mb.input_ids.shape == (2, 5)
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # Columns 0..3: the union of both rows' target columns (A: 1..3, B: 0..1).
    assert mb.logit_columns.tolist() == [0, 1, 2, 3]
    assert mb.loss_mask.tolist() == [[0, 1, 0, 1], [1, 1, 0, 0]]
    assert mb.target_ids.tolist() == [[0, 12, 13, 14], [21, 22, 0, 0]]
    assert mb.sample_index.tolist() == [[-1, 3, 3, 3], [7, 7, -1, -1]]
    assert mb.spans == [(3, 0, 1, 4), (7, 1, 0, 2)]


def test_empty_micro_batch_is_one_padding_row_without_loss():
    mb = build_micro_batch([], packing=True, pad_multiple=8, pad_token_id=0)
    assert mb.input_ids.shape == (1, 8) and mb.loss_mask.sum() == 0 and mb.spans == []
    assert mb.logit_columns.tolist() == [0] and mb.sample_index.tolist() == [[-1]]


def test_samples_with_one_prompt_share_it_in_the_row():
    items = [G1, H, G2]
    assert row_tokens(items, True) == 2 + 3 + 2 + 3 and row_tokens(items, False) == 12
    mb = build_micro_batch(
        items, packing=True, pad_multiple=4, pad_token_id=0, extra_names=("advantages",), share_prefixes=True
    )
    # prompt [30, 31] once, G1's and G2's responses after it, then H alone.
    assert mb.input_ids[0].tolist() == [30, 31, 40, 41, 42, 50, 51, 60, 61, 70, 0, 0]
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 3, 0, 1, 2, 0, 0]
    assert mb.segment_ids[0].tolist() == [0, 0, 1, 1, 1, 2, 2, 3, 3, 3, -1, -1]
    assert mb.segment_parents.tolist() == [-1, 0, 0, -1]
    # Targets in request order; the prompt's last token (column 1) predicts both responses' first.
    assert mb.logit_columns.tolist() == [1, 2, 3, 8, 1, 5]
    assert mb.target_ids[0].tolist() == [40, 41, 42, 70, 50, 51]
    assert mb.sample_index[0].tolist() == [0, 0, 0, 2, 1, 1]
    assert mb.loss_mask[0].tolist() == [1, 1, 0, 1, 1, 1]
    assert mb.extras["advantages"][0].tolist() == [1.0, 1.0, 1.0, 0.5, -1.0, -1.0]
    assert mb.spans == [(0, 0, 0, 3), (2, 0, 3, 4), (1, 0, 4, 6)]
    assert mb.num_tokens == 10


def test_any_common_beginning_is_shared_as_a_prefix_tree():
    """SFT prompts share the chat template and first words, responses may share digits."""
    items = [
        SequenceItem(0, [1, 2, 3, 4, 5], 3, [1, 1]),
        SequenceItem(1, [1, 2, 3, 6], 3, [1]),
        SequenceItem(2, [1, 2, 7, 8], 2, [1, 1]),
        SequenceItem(3, [9, 8], 1, [1]),
    ]
    mb = build_micro_batch(items, packing=True, pad_multiple=1, pad_token_id=0, share_prefixes=True)
    assert mb.input_ids[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 8]
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4, 3, 2, 3, 0, 1]
    assert mb.segment_ids[0].tolist() == [0, 0, 1, 2, 2, 3, 4, 4, 5, 5]
    assert mb.segment_parents.tolist() == [-1, 0, 1, 1, 0, -1]
    assert mb.logit_columns.tolist() == [2, 3, 2, 1, 6, 8]
    assert mb.target_ids[0].tolist() == [4, 5, 6, 7, 8, 8]
    unshared = build_micro_batch(items, packing=True, pad_multiple=1, pad_token_id=0)
    assert unshared.input_ids.shape[1] == 15 and unshared.segment_parents.tolist() == [-1] * 4
