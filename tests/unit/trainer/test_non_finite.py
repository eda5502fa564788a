"""Non-finite inputs (-inf, +inf, NaN) to every loss and rollout correction, against an
independent transcription of Miles' formulas, and the train/num_non_finite_tokens count."""

from __future__ import annotations

import math

import pytest
import torch

from rollway.common.config import from_dict
from rollway.trainer.config import TrainerConfig
from rollway.trainer.loss.losses import GlobalDenominators, LossInputs, aggregate, get_loss, metric_share

NON_FINITE = [-math.inf, math.inf, math.nan]
SAMPLE_LENGTHS = (3, 4, 2)  # three samples packed in one row
BAD = 4  # the position that gets the non-finite value: sample 1's second token


def settings(**overrides) -> TrainerConfig:
    return from_dict(TrainerConfig, {"hf_checkpoint": "m", **overrides})


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = sum(SAMPLE_LENGTHS)
    return {
        "log_probs": -torch.rand(n, generator=g, dtype=torch.float64) * 2 - 0.1,
        "old_log_probs": -torch.rand(n, generator=g, dtype=torch.float64) * 2 - 0.1,
        "rollout_log_probs": -torch.rand(n, generator=g, dtype=torch.float64) * 2 - 0.1,
        "ref_log_probs": -torch.rand(n, generator=g, dtype=torch.float64) * 2 - 0.1,
        "advantages": torch.tensor([-1.0] * 3 + [-0.5] * 4 + [1.0] * 2, dtype=torch.float64),
    }


def sample_index() -> torch.Tensor:
    return torch.tensor([i for i, n in enumerate(SAMPLE_LENGTHS) for _ in range(n)])


# --- Miles, transcribed (radixark/miles, miles/backends/training_utils/loss_hub/) -------------------
def miles_nan_to_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def miles_safe_exp_neg_ppo_kl(ppo_kl: torch.Tensor) -> torch.Tensor:
    # math_utils.py: _safe_clamp_log_ratio, _safe_exp_neg_ppo_kl
    x = torch.nan_to_num(-ppo_kl, nan=0.0, posinf=20.0, neginf=-20.0)
    return x.clamp(-20.0, 20.0).exp()


def miles_approx_kl(log_probs, log_probs_base, kl_loss_type):
    # math_utils.py: compute_approx_kl (no importance_ratio)
    log_ratio = log_probs - log_probs_base
    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = log_ratio**2 / 2.0
    else:
        log_ratio = -log_ratio
        if kl_loss_type == "low_var_kl":
            log_ratio = torch.nan_to_num(log_ratio, nan=0.0, posinf=20.0, neginf=-20.0).clamp(-20.0, 20.0)
        kl = log_ratio.exp() - 1 - log_ratio
    if kl_loss_type == "low_var_kl":
        kl = kl.clamp(-10, 10)
    return kl


def miles_sum_of_sample_mean(x: torch.Tensor) -> torch.Tensor:
    # loss.py: get_sum_of_sample_mean (all tokens are loss tokens here), over the global batch
    parts = x.split(list(SAMPLE_LENGTHS))
    return sum(p.sum() / max(p.numel(), 1) for p in parts) / len(SAMPLE_LENGTHS)


def miles_policy_loss(b, eps_clip=0.2, use_kl_loss=False, kl_loss_type="k1", kl_loss_coef=0.0, tis=None):
    """losses.py: policy_loss_function (per-token path, every token a loss token), with
    corrections.py: vanilla_tis_function / icepop_function when `tis` is ("truncate"|"icepop", low, high)."""
    ppo_kl = miles_nan_to_zero(b["old_log_probs"] - b["log_probs"])
    advantages = miles_nan_to_zero(b["advantages"])
    ratio = miles_safe_exp_neg_ppo_kl(ppo_kl)  # compute_policy_loss
    pg1 = -ratio * advantages
    pg2 = -ratio.clamp(1 - eps_clip, 1 + eps_clip) * advantages
    pg_loss = torch.maximum(pg1, pg2)
    if tis is not None:
        mode, low, high = tis
        r = torch.exp(b["old_log_probs"] - b["rollout_log_probs"])
        if mode == "truncate":
            weight = r.clamp(min=low, max=high)
        else:
            weight = torch.where((r >= low) & (r <= high), r, torch.zeros_like(r))
        pg_loss = pg_loss * weight
    loss = miles_sum_of_sample_mean(pg_loss)
    if use_kl_loss:
        kl = miles_nan_to_zero(miles_approx_kl(b["log_probs"], b["ref_log_probs"], kl_loss_type))
        loss = loss + kl_loss_coef * miles_sum_of_sample_mean(kl)
    return loss


# --- rollway ------------------------------------------------------------------------------------
def rollway_terms(b, config: TrainerConfig, loss_type="policy_loss"):
    n = sum(SAMPLE_LENGTHS)
    log_probs = b["log_probs"].clone().reshape(1, n).requires_grad_(True)
    extras = {k: v.reshape(1, n) for k, v in b.items() if k != "log_probs"}
    if config.use_rollout_logprobs or not (config.use_tis or config.use_mis or config.use_geo_mask):
        extras.pop("rollout_log_probs", None)
    inputs = LossInputs(
        log_probs=log_probs,
        loss_mask=torch.ones(1, n, dtype=torch.float64),
        sample_index=sample_index().reshape(1, n),
        settings=config,
        extras=extras,
    )
    terms = get_loss(loss_type).fn(inputs)
    denominators = GlobalDenominators(num_samples=len(SAMPLE_LENGTHS), num_loss_tokens=n)
    loss = aggregate(terms["loss"], inputs.loss_mask, inputs.sample_index, denominators, False)
    count = metric_share(
        "num_non_finite_tokens",
        terms["num_non_finite_tokens"],
        inputs.loss_mask,
        inputs.sample_index,
        denominators,
        False,
    )
    return terms, loss, float(count), log_probs


def with_value(field: str, value: float, seed: int = 0) -> dict[str, torch.Tensor]:
    b = batch(seed)
    b[field][BAD] = value
    return b


def test_one_minus_inf_old_log_prob_no_correction_is_miles_loss():
    """Issue #24's case: before, rollway's loss was ~1e7 (ratio e^20 on one token); Miles': ratio 1."""
    b = with_value("old_log_probs", -math.inf)
    _, loss, count, _ = rollway_terms(b, settings())
    expected = miles_policy_loss(b)
    assert math.isfinite(float(loss.detach())) and abs(float(loss.detach())) < 5.0
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-12)
    assert count == 1.0


@pytest.mark.parametrize("value", NON_FINITE, ids=["-inf", "+inf", "nan"])
@pytest.mark.parametrize("field", ["old_log_probs", "log_probs", "advantages"])
def test_policy_loss_matches_miles_and_counts(field, value):
    b = with_value(field, value)
    terms, loss, count, log_probs = rollway_terms(b, settings(eps_clip=0.2))
    assert float(loss.detach()) == pytest.approx(float(miles_policy_loss(b)), rel=1e-12)
    assert count == 1.0
    assert terms["ppo_kl"][0, BAD].item() == 0.0 or field == "advantages"
    loss.backward()
    grad = log_probs.grad[0]
    assert torch.isfinite(grad).all()
    if field != "advantages":  # the token's ratio is the constant 1: no gradient through it
        assert grad[BAD].item() == 0.0
    clean = rollway_terms(batch(), settings())[2]
    assert clean == 0.0


@pytest.mark.parametrize("value", NON_FINITE, ids=["-inf", "+inf", "nan"])
@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_loss_matches_miles_with_non_finite_reference(kl_type, value):
    b = with_value("ref_log_probs", value)
    config = settings(use_kl_loss=True, kl_loss_type=kl_type, kl_loss_coef=0.3)
    terms, loss, count, log_probs = rollway_terms(b, config)
    expected = miles_policy_loss(b, use_kl_loss=True, kl_loss_type=kl_type, kl_loss_coef=0.3)
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-6)  # approx_kl works in float32
    assert torch.isfinite(terms["kl_loss"]).all()
    assert count == 1.0
    loss.backward()
    assert torch.isfinite(log_probs.grad).all()


@pytest.mark.parametrize("value", NON_FINITE, ids=["-inf", "+inf", "nan"])
def test_icepop_weight_of_a_non_finite_ratio_is_zero_as_miles(value):
    b = with_value("rollout_log_probs", value)
    config = settings(use_tis=True, tis_mode="icepop", tis_clip_low=0.5, tis_clip=2.0)
    terms, loss, count, _ = rollway_terms(b, config)
    assert float(loss.detach()) == pytest.approx(
        float(miles_policy_loss(b, tis=("icepop", 0.5, 2.0))), rel=1e-6
    )
    assert terms["pg_loss"][0, BAD].item() == 0.0  # r = 0, inf or NaN: outside [0.5, 2]: popped
    # clipfrac is weight != r (Miles): r = exp(old - (+inf)) = 0 popped to 0 is no change.
    assert terms["tis_clipfrac"][0, BAD].item() == (0.0 if value == math.inf else 1.0)
    assert all(torch.isfinite(terms[k]).all() for k in ("tis", "tis_min", "tis_max"))
    assert count == 1.0


@pytest.mark.parametrize("value", [-math.inf, math.inf], ids=["-inf", "+inf"])
def test_truncated_is_clamps_infinite_ratios_as_miles(value):
    b = with_value("rollout_log_probs", value)
    config = settings(use_tis=True, tis_clip_low=0.5, tis_clip=2.0)
    _, loss, count, _ = rollway_terms(b, config)
    assert float(loss.detach()) == pytest.approx(
        float(miles_policy_loss(b, tis=("truncate", 0.5, 2.0))), rel=1e-6
    )
    assert count == 1.0


def test_truncated_is_of_a_nan_ratio_is_zero_where_miles_is_nan():
    """Deliberate difference: Miles' clamp keeps NaN, so its whole loss is NaN; rollway pops the
    token, like IcePop (docs/algorithms.md's rule for NaN log-ratios)."""
    b = with_value("rollout_log_probs", math.nan)
    config = settings(use_tis=True, tis_clip_low=0.5, tis_clip=2.0)
    terms, loss, count, _ = rollway_terms(b, config)
    assert math.isnan(float(miles_policy_loss(b, tis=("truncate", 0.5, 2.0))))
    assert terms["pg_loss"][0, BAD].item() == 0.0
    b_without = batch()
    b_without["advantages"][BAD] = 0.0  # the same loss as the token not counting at all
    b_without["rollout_log_probs"][BAD] = b_without["old_log_probs"][BAD]
    assert float(loss.detach()) == pytest.approx(
        float(miles_policy_loss(b_without, tis=("truncate", 0.5, 2.0))), rel=1e-6
    )
    assert count == 1.0


@pytest.mark.parametrize("value", NON_FINITE, ids=["-inf", "+inf", "nan"])
@pytest.mark.parametrize(
    "correction",
    [
        {"use_mis": True, "mis_low": 0.01, "mis_high": 100.0},
        {"use_mis": True, "mis_level": "sequence", "mis_low": 0.01, "mis_high": 100.0},
        {"use_geo_mask": True, "geo_mask_low": 0.01, "geo_mask_high": 100.0},
    ],
    ids=["mis-token", "mis-sequence", "geo-mask"],
)
def test_masking_corrections_mask_non_finite_ratios(correction, value):
    b = with_value("rollout_log_probs", value)
    terms, loss, count, _ = rollway_terms(b, settings(**correction))
    sequence = correction.get("mis_level") == "sequence" or "use_geo_mask" in correction
    masked = slice(3, 7) if sequence else slice(BAD, BAD + 1)  # the token, or its whole sample
    assert (terms["pg_loss"][0, masked] == 0.0).all()
    others = torch.ones(sum(SAMPLE_LENGTHS), dtype=torch.bool)
    others[masked] = False
    assert (terms["pg_loss"][0, others] != 0.0).all()  # wide bands: nothing else is masked
    assert math.isfinite(float(loss.detach()))
    assert all(torch.isfinite(t).all() for t in terms.values())
    assert count == 1.0


@pytest.mark.parametrize("value", NON_FINITE, ids=["-inf", "+inf", "nan"])
def test_mismatch_metrics_count_a_non_finite_token_as_zero(value):
    b = with_value("rollout_log_probs", value)
    terms, _, _, _ = rollway_terms(b, settings(use_tis=True))
    assert terms["train_rollout_logprob_abs_diff"][0, BAD].item() == 0.0  # Miles: nan_to_num(abs_diff)
    assert math.isfinite(terms["train_rollout_kl"][0, BAD].item())


@pytest.mark.parametrize("value", NON_FINITE, ids=["-inf", "+inf", "nan"])
def test_sft_loss_keeps_a_non_finite_log_prob_as_miles_and_counts_it(value):
    b = with_value("log_probs", value)
    _, loss, count, _ = rollway_terms(b, settings(loss_type="sft_loss"), loss_type="sft_loss")
    expected = -miles_sum_of_sample_mean(b["log_probs"])  # losses.py: sft_loss_function
    assert float(loss.detach()) == pytest.approx(float(expected), nan_ok=True)
    assert count == 1.0


def test_count_sums_over_loss_tokens_only():
    term = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    share = metric_share(
        "num_non_finite_tokens",
        term,
        mask,
        torch.zeros(1, 4, dtype=torch.long),
        GlobalDenominators(1, 3),
        False,
    )
    assert float(share) == 2.0
