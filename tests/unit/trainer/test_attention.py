"""Packed rows must not leak attention across samples: a packed row's logits equal each sample alone."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollway.trainer.attention import block_causal_mask, hf_attn_implementation, model_inputs, segment_bounds
from rollway.trainer.micro_batch import SequenceItem, build_micro_batch

ITEMS = [
    SequenceItem(0, [5, 17, 33, 80, 2, 9, 41], 2, [1] * 5),
    SequenceItem(1, [7, 8, 9, 10, 11], 0, [1] * 5),
    SequenceItem(2, [100, 200, 150, 120, 99, 98, 97, 96, 3], 3, [1] * 6),
]


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tiny_model_dir):
    """The tiny model with the attention the trainer uses for --attn-implementation <param>."""
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=hf_attn_implementation(request.param)
    ).eval()
    model.trainer_attn = request.param
    return model


def alone(model, item: SequenceItem) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([item.token_ids])).logits[0]


def test_block_causal_mask_isolates_segments_and_padding():
    segments = torch.tensor([[0, 0, 1, 1, 1, -1, -1]])
    mask = block_causal_mask(segments)[0, 0]
    assert mask.shape == (7, 7)
    assert mask[1].tolist() == [True, True, False, False, False, False, False]
    assert mask[4].tolist() == [False, False, True, True, True, False, False]
    assert mask[6].tolist() == [False, False, False, False, False, True, True]  # padding sees padding only
    assert mask.sum(-1).min() >= 1  # no empty row (would make NaNs in softmax)
    assert segment_bounds(segments).tolist() == [0, 2, 5, 7]


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_logits_equal_each_sample_run_alone(model, packing):
    mb = build_micro_batch(ITEMS, packing=packing, pad_multiple=16, pad_token_id=0)
    inputs = model_inputs(mb, model.trainer_attn, torch.float32, torch.device("cpu"))
    with torch.no_grad():
        logits = model(**inputs).logits
    if packing:
        assert logits.shape[:2] == (1, 32)  # 21 tokens padded to a multiple of 16
    for slot, item in enumerate(ITEMS):
        row = 0 if packing else slot
        positions = (mb.segment_ids[row] == slot).nonzero()[:, 0]
        torch.testing.assert_close(logits[row, positions], alone(model, item), atol=2e-5, rtol=1e-5)


def test_transformers_alone_leaks_across_packed_samples_with_its_default_cache(tiny_model_dir):
    """Why attention.py passes boundaries itself: with position_ids only and the config's
    use_cache=True, transformers 5.23 skips its packed-sequence detection and the second sample
    attends to the first. (If this starts failing, transformers changed its behaviour; the
    explicit boundaries stay correct either way.)"""
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    first, second = ITEMS[0], ITEMS[2]
    ids = torch.tensor([first.token_ids + second.token_ids])
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))])
    with torch.no_grad():
        leaked = model.eval()(input_ids=ids, position_ids=positions).logits[0, len(first) :]
    assert (leaked - alone(model, second)).abs().max() > 1e-2
