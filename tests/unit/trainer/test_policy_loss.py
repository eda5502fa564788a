"""policy_loss per token, against hand-computed values: PPO clip (asymmetric, dual), the ratio
clamp, GSPO's sequence ratio, TIS weights and clipping, the mismatch metrics, entropy and KL terms."""

from __future__ import annotations

import math

import pytest
import torch

from rollway.common.config import from_dict
from rollway.trainer.config import TrainerConfig
from rollway.trainer.loss.losses import LossInputs, get_loss
from rollway.trainer.loss.policy_loss import (
    clipped_policy_loss,
    per_sample_mean,
)
from rollway.trainer.loss.rollout_correction import truncated_importance_weights


def settings(**overrides) -> TrainerConfig:
    return from_dict(TrainerConfig, {"hf_checkpoint": "m", **overrides})


def log(values):
    return torch.tensor([math.log(v) for v in values], dtype=torch.float64)


def test_ppo_clip_asymmetric_hand_computed():
    # ratios and advantages: (0.5, +1) (1.0, +1) (1.5, +1) (1.5, -1) (0.5, -1); clip [0.8, 1.3]
    loss, clipfrac = clipped_policy_loss(
        log([0.5, 1.0, 1.5, 1.5, 0.5]),
        torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0], dtype=torch.float64),
        0.2,
        0.3,
    )
    assert loss.tolist() == pytest.approx([-0.5, -1.0, -1.3, 1.5, 0.8])
    assert clipfrac.tolist() == [0.0, 0.0, 1.0, 0.0, 1.0]


def test_clip_fraction_at_the_boundaries():
    eps = 0.2
    inside = log([1 + eps - 1e-6, 1 - eps + 1e-6])
    outside = log([1 + eps + 1e-6, 1 - eps - 1e-6])
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    assert clipped_policy_loss(inside, advantages, eps, eps)[1].tolist() == [0.0, 0.0]
    assert clipped_policy_loss(outside, advantages, eps, eps)[1].tolist() == [1.0, 1.0]
    # Clipping only ever counts when it raises the loss: a ratio beyond 1 + eps with A < 0 is not clipped.
    assert clipped_policy_loss(outside, -advantages, eps, eps)[1].tolist() == [0.0, 0.0]
    # The equal case is not a clip: ratio exactly 1 with eps 0 gives equal branches.
    assert clipped_policy_loss(torch.zeros(2), torch.ones(2), 0.0, 0.0)[1].tolist() == [0.0, 0.0]


def test_dual_clip_bounds_negative_advantages_only():
    loss, _ = clipped_policy_loss(
        log([5.0, 5.0, 2.0]), torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64), 0.2, 0.2, 3.0
    )
    # A < 0, ratio 5: max(5, 1.2) = 5, bounded by 3 * |A| = 3; A > 0: -1.2 (clipped); ratio 2 < 3: 2.
    assert loss.tolist() == pytest.approx([3.0, -1.2, 2.0])


def test_ratio_is_exp_of_the_clamped_log_ratio():
    loss, _ = clipped_policy_loss(torch.tensor([50.0, -50.0]), torch.tensor([-1.0, -1.0]), 0.2, 0.2)
    assert loss.tolist() == pytest.approx([math.exp(20.0), 0.8])


def test_per_sample_mean_over_loss_tokens():
    values = torch.tensor([[1.0, 3.0, 100.0, 2.0, 4.0, 6.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]])
    index = torch.tensor([[0, 0, 0, 5, 5, 5, -1]])
    assert per_sample_mean(values, mask, index)[0, :6].tolist() == [2.0, 2.0, 2.0, 4.0, 4.0, 4.0]


def test_tis_weights_are_clipped_to_the_range():
    train, rollout = log([0.1, 1.0, 3.0, 0.5]), torch.zeros(4, dtype=torch.float64)
    weights, metrics = truncated_importance_weights(train - rollout, 0.5, 2.0, "truncate")
    assert metrics["tis"].tolist() == pytest.approx([0.1, 1.0, 3.0, 0.5])
    assert weights.tolist() == pytest.approx([0.5, 1.0, 2.0, 0.5])
    assert metrics["tis_clipfrac"].tolist() == [1.0, 0.0, 1.0, 0.0]


def inputs(log_probs, advantages, config, **extras) -> LossInputs:
    n = len(log_probs)
    return LossInputs(
        log_probs=torch.tensor([log_probs], requires_grad=True),
        loss_mask=torch.ones(1, n),
        sample_index=torch.tensor([[0] * (n // 2) + [1] * (n - n // 2)]),
        settings=config,
        entropy=torch.full((1, n), 0.5),
        extras={
            "advantages": torch.tensor([advantages]),
            **{k: torch.tensor([v]) for k, v in extras.items()},
        },
    )


def test_policy_loss_terms_with_tis_entropy_and_kl_loss():
    config = settings(use_tis=True, tis_clip=2.0, entropy_coef=0.1, use_kl_loss=True, kl_loss_coef=0.5)
    logp = [math.log(0.5), math.log(0.25)]
    terms = get_loss("policy_loss").fn(
        inputs(
            logp,
            [1.0, -1.0],
            config,
            old_log_probs=logp,  # ratio 1
            rollout_log_probs=[math.log(0.25), math.log(0.5)],  # TIS 2 and 0.5
            ref_log_probs=[math.log(0.25), math.log(0.25)],
        )
    )
    assert terms["tis"][0].tolist() == pytest.approx([2.0, 0.5])
    assert terms["tis_clipfrac"][0].tolist() == [0.0, 0.0]
    assert terms["pg_loss"][0].tolist() == pytest.approx([-2.0, 0.5])  # (-1 * 1, +1 * 1) * TIS
    assert terms["kl_loss"][0].tolist() == pytest.approx([math.log(2.0), 0.0])  # k1
    expected = [-2.0 - 0.05 + 0.5 * math.log(2.0), 0.5 - 0.05]
    assert terms["loss"][0].tolist() == pytest.approx(expected)
    assert terms["train_rollout_logprob_abs_diff"][0].tolist() == pytest.approx([math.log(2.0)] * 2)
    # KL(rollout || train) by k3 with log r = rollout - train: exp(-log r) - 1 + log r.
    k3 = [math.exp(math.log(2)) - 1 - math.log(2), math.exp(-math.log(2)) - 1 + math.log(2)]
    assert terms["train_rollout_kl"][0].tolist() == pytest.approx(k3)
    assert terms["ppo_kl"][0].tolist() == [0.0, 0.0]
    terms["loss"].sum().backward()


def test_gspo_uses_the_sequence_ratio_and_old_defaults_to_detached_current():
    config = settings(advantage_estimator="gspo", eps_clip=10.0)
    # Sample 0: log r = (log 2, 0) -> mean log 2 / 2; sample 1: (0, 0).
    terms = get_loss("policy_loss").fn(
        inputs(
            [0.0, 0.0, -1.0, -1.0],
            [1.0, 1.0, 1.0, 1.0],
            config,
            old_log_probs=[-math.log(2.0), 0.0, -1.0, -1.0],
        )
    )
    r0 = math.sqrt(2.0)
    assert terms["pg_loss"][0].tolist() == pytest.approx([-r0, -r0, -1.0, -1.0])
    assert terms["ppo_kl"][0].tolist() == pytest.approx([-math.log(2) / 2] * 2 + [0.0, 0.0])
    # Without old log-probs (one optimizer step): ratio 1 everywhere, gradient of -A * logp.
    plain = inputs([-0.3, -0.2, -1.0, -0.1], [1.0, -2.0, 0.5, 0.5], settings())
    terms = get_loss("policy_loss").fn(plain)
    assert terms["pg_loss"][0].tolist() == pytest.approx([-1.0, 2.0, -0.5, -0.5])
    terms["pg_loss"].sum().backward()
    assert plain.log_probs.grad[0].tolist() == pytest.approx([-1.0, 2.0, -0.5, -0.5])


def test_use_rollout_logprobs_takes_the_ratio_against_the_rollout():
    config = settings(use_rollout_logprobs=True)
    terms = get_loss("policy_loss").fn(
        inputs([0.0, 0.0], [1.0, 1.0], config, rollout_log_probs=[-math.log(1.1), 0.0])
    )
    assert terms["pg_loss"][0].tolist() == pytest.approx([-1.1, -1.0])
    assert terms["ppo_kl"][0].tolist() == pytest.approx([-math.log(1.1), 0.0])
