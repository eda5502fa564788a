"""The ForwardBackward losses (datum_losses.py) against the Tinker documentation's formulas, and
their gradients where the formulas stop them (ppo's clipped side, cispo's detached ratio)."""

from __future__ import annotations

import pytest
import torch

from rollway.trainer.loss.datum_losses import DATUM_LOSSES


def inputs(logp: list[float], sampling: list[float], advantages: list[float]):
    return (
        torch.tensor(logp, requires_grad=True),
        {"sampling_log_probs": torch.tensor(sampling), "advantages": torch.tensor(advantages)},
    )


def test_cross_entropy_is_weighted_negative_log_likelihood():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    terms = DATUM_LOSSES["cross_entropy"].fn(logp, {"weights": torch.tensor([1.0, 0.0, 2.0])}, {})
    assert terms.tolist() == [1.0, 0.0, 1.0]


def test_importance_sampling_gradient_is_ratio_times_advantage():
    logp, extras = inputs([-1.0, -2.0], [-1.5, -2.0], [2.0, -1.0])
    DATUM_LOSSES["importance_sampling"].fn(logp, extras, {}).sum().backward()
    ratio = torch.exp(torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(logp.grad, -ratio * torch.tensor([2.0, -1.0]))


def test_ppo_has_no_gradient_where_the_clipped_side_is_taken():
    # ratio e^0.5 = 1.65 > 1.2 with a positive advantage: min picks the clipped, constant side.
    logp, extras = inputs([-1.0, -1.0], [-1.5, -1.0], [1.0, 1.0])
    terms = DATUM_LOSSES["ppo"].fn(logp, extras, {})
    terms.sum().backward()
    assert terms[0].item() == pytest.approx(-1.2)
    assert logp.grad.tolist() == pytest.approx([0.0, -1.0])


def test_ppo_is_the_tinker_formula_below_the_log_ratio_clamp_and_finite_beyond_it():
    logp, extras = inputs([-1.0, -1.0, -1.3, -0.9], [-1.5, -0.7, -1.0, -1.0], [1.0, -2.0, 0.5, -1.0])
    config = {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}
    terms = DATUM_LOSSES["ppo"].fn(logp, extras, config)
    ratio = torch.exp(logp.detach() - extras["sampling_log_probs"])
    advantages = extras["advantages"]
    documented = -torch.minimum(ratio * advantages, ratio.clamp(0.7, 1.3) * advantages)
    torch.testing.assert_close(terms.detach(), documented)
    # A token 30 nats more likely than when it was sampled, with a negative advantage: the
    # unclipped side is taken; the clamp keeps its value e^20 * |A| and its gradient finite (0).
    stale, extras = inputs([-0.5], [-30.5], [-1.0])
    term = DATUM_LOSSES["ppo"].fn(stale, extras, {})
    term.sum().backward()
    assert term.item() == pytest.approx(float(torch.exp(torch.tensor(20.0))))
    assert torch.isfinite(stale.grad).all()


def test_cispo_weights_log_prob_gradients_by_the_clipped_ratio_without_differentiating_it():
    logp, extras = inputs([-1.0, -1.0], [-1.5, -0.5], [1.0, 1.0])
    terms = DATUM_LOSSES["cispo"].fn(logp, extras, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    terms.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-1.2, -0.8])  # the clipped ratios, e^0.5 and e^-0.5
