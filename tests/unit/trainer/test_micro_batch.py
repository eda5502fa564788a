"""Model inputs of a micro-batch: positions restart per sample, targets and masks line up."""

from __future__ import annotations

import pytest

from rollway.trainer.micro_batch import SequenceItem, build_micro_batch

A = SequenceItem(3, [10, 11, 12, 13, 14], 2, [1, 0, 1], {"advantages": [0.5, 0.6, 0.7]})
B = SequenceItem(7, [20, 21, 22], 0, [1, 1, 1], {"advantages": [1.0, 2.0, 3.0]})


def test_packed_row_layout():
    mb = build_micro_batch([A, B], packing=True, pad_multiple=4, pad_token_id=0, extra_names=("advantages",))
    assert mb.packed and mb.input_ids.shape == (1, 8)
    assert mb.input_ids[0].tolist() == [10, 11, 12, 13, 14, 20, 21, 22]
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert mb.segment_ids[0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    # Position p predicts the next token of its own sample; the last token of a sample predicts nothing.
    assert mb.target_ids[0].tolist() == [11, 12, 13, 14, 0, 21, 22, 0]
    assert mb.sample_index[0].tolist() == [3, 3, 3, 3, -1, 7, 7, -1]
    # A's response tokens 12, 13, 14 are predicted at positions 1, 2, 3; B has no prompt, so its
    # first response token has no prediction and 21, 22 are predicted at positions 5, 6.
    assert mb.loss_mask[0].tolist() == [0, 1, 0, 1, 0, 1, 1, 0]
    assert mb.extras["advantages"][0].tolist() == pytest.approx([0, 0.5, 0.6, 0.7, 0, 2.0, 3.0, 0])
    assert mb.spans == [(3, 0, 1, 4), (7, 0, 5, 7)]
    assert mb.num_tokens == 8


def test_packed_row_is_padded_to_the_multiple():
    mb = build_micro_batch([A, B], packing=True, pad_multiple=16, pad_token_id=0)
    assert mb.input_ids.shape == (1, 16)
    assert mb.segment_ids[0, 8:].tolist() == [-1] * 8
    assert mb.loss_mask[0, 8:].sum() == 0


def test_padded_layout_has_one_row_per_sample():
    mb = build_micro_batch([A, B], packing=False, pad_multiple=16, pad_token_id=0)
    assert not mb.packed and mb.input_ids.shape == (2, 5)
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert mb.loss_mask.tolist() == [[0, 1, 0, 1, 0], [1, 1, 0, 0, 0]]
    assert mb.spans == [(3, 0, 1, 4), (7, 1, 0, 2)]


def test_empty_micro_batch_is_one_padding_row_without_loss():
    mb = build_micro_batch([], packing=True, pad_multiple=8, pad_token_id=0)
    assert mb.input_ids.shape == (1, 8) and mb.loss_mask.sum() == 0 and mb.spans == []
