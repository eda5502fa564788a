"""KL estimators and the trainer's token-level returns (reinforce_plus_plus, _baseline, whitening),
against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rollway.common.advantages import sequence_advantages
from rollway.trainer.loss.kl import approx_kl
from rollway.trainer.loss.returns import (
    discounted_returns,
    reinforce_plus_plus_baseline,
    reinforce_plus_plus_returns,
    whiten,
)

LOGP = torch.tensor([math.log(0.5), math.log(0.5), math.log(0.1)])
REF = torch.tensor([math.log(0.25), math.log(0.5), math.log(0.1 * math.exp(20))])
LOG_R = [math.log(2.0), 0.0, -20.0]


@pytest.mark.parametrize(
    "kl_type, expected",
    [
        ("k1", LOG_R),
        ("k2", [r * r / 2 for r in LOG_R]),
        ("k3", [math.exp(-r) - 1 + r for r in LOG_R]),
        ("low_var_kl", [math.exp(-LOG_R[0]) - 1 + LOG_R[0], 0.0, 10.0]),
    ],
)
def test_kl_estimators(kl_type, expected):
    assert approx_kl(LOGP, REF, kl_type).tolist() == pytest.approx(expected, rel=1e-5)


def test_kl_of_equal_log_probs_is_exactly_zero():
    for kl_type in ("k1", "k2", "k3", "low_var_kl"):
        assert approx_kl(LOGP, LOGP, kl_type).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="kl_loss_type"):
        approx_kl(LOGP, LOGP, "k4")


def test_discounted_returns():
    assert discounted_returns(torch.tensor([1.0, 2.0, 3.0]), 1.0).tolist() == [6.0, 5.0, 3.0]
    assert discounted_returns(torch.tensor([0.0, 0.0, 1.0]), 0.5).tolist() == [0.25, 0.5, 1.0]


def test_reinforce_plus_plus_reward_at_the_last_loss_token_and_kl_penalty():
    # Loss mask [1, 1, 0]: the reward r = 1 goes to token 1; token rewards -0.5 * kl * mask.
    returns = reinforce_plus_plus_returns(
        torch.ones(3), torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1.0, 1.0, 0.0]), kl_coef=0.5, gamma=0.5
    )
    assert returns.tolist() == pytest.approx([-0.05 + 0.5 * 0.9, 0.9, 0.0])


def test_reinforce_plus_plus_baseline_subtracts_the_kl_per_token():
    values = reinforce_plus_plus_baseline(torch.tensor([0.5, 0.5]), torch.tensor([0.2, -0.2]), kl_coef=0.5)
    assert values.tolist() == pytest.approx([0.4, 0.6])


def test_whiten_over_loss_tokens_with_unbiased_variance():
    values = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 50.0])]
    masks = [torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0])]  # 50 is outside the statistics
    out = whiten(values, masks, distributed=False)
    scale = 1 / math.sqrt(1.0 + 1e-8)  # mean 2, unbiased variance 1
    assert out[0].tolist() == pytest.approx([-scale, 0.0])
    assert out[1].tolist() == pytest.approx([scale, 48 * scale])


def test_baseline_estimator_end_to_end_from_the_coordinator_values():
    """Coordinator: r - group mean; trainer: minus kl_coef * kl, then whitened."""
    rewards = [1.0, 0.0]  # one group of two
    sequence = sequence_advantages("reinforce_plus_plus_baseline", rewards, 2)
    assert sequence.tolist() == [0.5, -0.5]
    kl = [torch.tensor([0.0, 0.2]), torch.tensor([0.2, 0.0])]
    per_token = [
        reinforce_plus_plus_baseline(torch.full((2,), a), k, 0.5) for a, k in zip(sequence, kl, strict=True)
    ]
    assert [t.tolist() for t in per_token] == [pytest.approx([0.5, 0.4]), pytest.approx([-0.6, -0.5])]
    out = whiten(per_token, [torch.ones(2), torch.ones(2)], distributed=False)
    flat = torch.cat(per_token).double()
    expected = (flat - flat.mean()) / torch.sqrt(flat.var(unbiased=True) + 1e-8)
    assert torch.cat(out).tolist() == pytest.approx(expected.tolist(), rel=1e-6)
