"""Loss registry and global-denominator aggregation."""

from __future__ import annotations

import pytest
import torch

from rollway.trainer.config import LOSS_TYPES, TrainerConfig
from rollway.trainer.loss.losses import (
    LOSSES,
    GlobalDenominators,
    LossInputs,
    aggregate,
    get_loss,
    register_loss,
)


def test_registry_matches_the_config_choices():
    assert set(LOSSES) == set(LOSS_TYPES)
    with pytest.raises(KeyError, match="loss_type: unknown 'nope'"):
        get_loss("nope")


def test_sft_loss_is_the_negative_log_likelihood():
    inputs = LossInputs(
        log_probs=torch.tensor([[-1.0, -2.0]]),
        loss_mask=torch.ones(1, 2),
        sample_index=torch.zeros(1, 2, dtype=torch.long),
        settings=TrainerConfig(hf_checkpoint="x"),
    )
    assert get_loss("sft_loss").fn(inputs)["loss"].tolist() == [[1.0, 2.0]]


def test_a_new_loss_plugs_in_with_its_per_token_inputs():
    @register_loss("test_weighted_loss", per_token_inputs=("advantages",))
    def weighted(inputs):
        return {"loss": -inputs.log_probs * inputs.extras["advantages"]}

    try:
        spec = get_loss("test_weighted_loss")
        assert spec.per_token_inputs == ("advantages",)
        inputs = LossInputs(
            torch.tensor([-1.0]),
            torch.ones(1),
            torch.zeros(1, dtype=torch.long),
            None,
            extras={"advantages": torch.tensor([2.0])},
        )
        assert spec.fn(inputs)["loss"].item() == 2.0
    finally:
        LOSSES.pop("test_weighted_loss")


# Two samples: sample 0 has token losses [1, 3] (mean 2), sample 1 has [4] and one masked token.
TERM = torch.tensor([1.0, 3.0, 4.0, 100.0])
MASK = torch.tensor([1.0, 1.0, 1.0, 0.0])
INDEX = torch.tensor([0, 0, 1, 1])


def test_per_sample_mean_over_the_global_batch():
    denominators = GlobalDenominators(num_samples=4, num_loss_tokens=10)  # the other samples live elsewhere
    assert aggregate(TERM, MASK, INDEX, denominators, per_token=False).item() == pytest.approx((2 + 4) / 4)


def test_per_token_sum_over_global_tokens():
    denominators = GlobalDenominators(num_samples=4, num_loss_tokens=10)
    assert aggregate(TERM, MASK, INDEX, denominators, per_token=True).item() == pytest.approx(8 / 10)


def test_shares_of_any_split_add_up_to_the_whole():
    denominators = GlobalDenominators(num_samples=2, num_loss_tokens=3)
    for per_token in (False, True):
        whole = aggregate(TERM, MASK, INDEX, denominators, per_token)
        parts = aggregate(TERM[:2], MASK[:2], INDEX[:2], denominators, per_token) + aggregate(
            TERM[2:], MASK[2:], INDEX[2:], denominators, per_token
        )
        assert parts.item() == pytest.approx(whole.item())


def test_padding_only_micro_batch_contributes_zero_but_keeps_the_graph():
    term = torch.ones(4, requires_grad=True)
    share = aggregate(term, torch.zeros(4), torch.full((4,), -1), GlobalDenominators(2, 3), per_token=False)
    share.backward()
    assert share.item() == 0.0 and term.grad.abs().sum() == 0
