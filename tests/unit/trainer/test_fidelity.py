"""rollway's RL formulas pinned to references written here, independently of the code under test.

The references are plain Python (loops, math, statistics) transcribed from Miles' definitions
(and the Dr.GRPO paper, verl/SkyRL for MIS and the geometric mask); rollway's functions run on
random inputs and must agree. Covered: the advantages of every estimator (the coordinator's group
part and the trainer's token part), the PPO/GSPO/Dr.GRPO policy loss, KL estimators with
non-finite inputs, TIS/IcePop/MIS/geometric masking and their metrics, the SFT loss, and the
per-sample and per-token aggregation for 1 vs several micro-batches; 1 vs 2 real FSDP2 ranks in
tests/integration/trainer/test_fidelity_ranks.py.
"""

from __future__ import annotations

import math
import random
import statistics
from types import SimpleNamespace

import pytest
import torch

from rollway.common.advantages import sequence_advantages
from rollway.common.config import from_dict, to_dict
from rollway.common.errors import InvalidArgument
from rollway.trainer.config import STEP_SETTINGS, TrainerConfig
from rollway.trainer.controller import merge_settings
from rollway.trainer.loss.kl import approx_kl
from rollway.trainer.loss.losses import GlobalDenominators, LossInputs, aggregate, get_loss
from rollway.trainer.loss.returns import reinforce_plus_plus_baseline, reinforce_plus_plus_returns, whiten
from rollway.trainer.policy_inputs import completes_advantages

# ---------------------------------------------------------------- references (written from the papers)


def ref_group_part(estimator, rewards, n, std_normalization=True, rewards_normalization=True):
    """Miles' rollout-side reward post-processing (plus rloo and dr_grpo), per sample."""
    out = []
    for start in range(0, len(rewards), n):
        group = rewards[start : start + n]
        mean = sum(group) / n
        for r in group:
            if estimator == "reinforce_plus_plus" or not rewards_normalization:
                out.append(r)
            elif estimator in ("grpo", "gspo") and std_normalization and n > 1:
                out.append((r - mean) / (statistics.stdev(group) + 1e-6))  # sample std (n - 1)
            elif estimator == "rloo":
                out.append(r - (sum(group) - r) / (n - 1) if n > 1 else 0.0)
            else:
                out.append(r - mean)
    return out


def ref_rpp_returns(reward, kl, mask, kl_coef, gamma):
    token_rewards = [-kl_coef * k * m for k, m in zip(kl, mask, strict=True)]
    last = max(t for t, m in enumerate(mask) if m)
    token_rewards[last] += reward
    return [sum(gamma ** (k - t) * token_rewards[k] for k in range(t, len(mask))) for t in range(len(mask))]


def ref_whiten(values, masks):
    flat = [v for vs, ms in zip(values, masks, strict=True) for v, m in zip(vs, ms, strict=True) if m]
    mean = sum(flat) / len(flat)
    var = sum((v - mean) ** 2 for v in flat) / (len(flat) - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in vs] for vs in values]


def ref_kl(lp, other, kind):
    x = lp - other
    if kind == "k1":
        return x
    if kind == "k2":
        return x * x / 2
    if kind == "k3":
        return math.exp(-x) - 1 + x
    x = 0.0 if math.isnan(x) else max(-20.0, min(20.0, x))  # low_var_kl: finite, clamped
    return max(-10.0, min(10.0, math.exp(-x) - 1 + x))


def ref_ppo(log_ratio, adv, eps, eps_high, eps_c=None):
    ratio = math.exp(max(-20.0, min(20.0, log_ratio)))
    loss = max(-ratio * adv, -min(max(ratio, 1 - eps), 1 + eps_high) * adv)
    if eps_c is not None and adv < 0:
        loss = min(loss, -eps_c * adv)
    return loss


def ref_weights(kind, train, rollout, mask, low, high):
    """Per-token rollout-correction weight of one sample."""
    d = [t - r for t, r in zip(train, rollout, strict=True)]
    inside = lambda x: low <= x <= high  # noqa: E731
    if kind == "truncate":
        return [min(max(math.exp(x), low), high) for x in d]
    if kind in ("icepop", "mis_token"):
        return [math.exp(x) if inside(math.exp(x)) else 0.0 for x in d]
    masked = [x for x, m in zip(d, mask, strict=True) if m]
    if kind == "mis_sequence":
        ratio = math.exp(sum(masked))
        return [ratio if inside(ratio) else 0.0] * len(d)
    geo = math.exp(sum(masked) / len(masked))  # geometric mean of the token ratios
    return [1.0 if inside(geo) else 0.0] * len(d)


def ref_aggregate(per_sample_terms, per_sample_masks, per_token, num_samples=None):
    if per_token:
        total = sum(
            t * m
            for ts, ms in zip(per_sample_terms, per_sample_masks, strict=True)
            for t, m in zip(ts, ms, strict=True)
        )
        return total / sum(sum(ms) for ms in per_sample_masks)
    means = [
        sum(t * m for t, m in zip(ts, ms, strict=True)) / max(sum(ms), 1)
        for ts, ms in zip(per_sample_terms, per_sample_masks, strict=True)
    ]
    return sum(means) / (num_samples or len(means))


# ---------------------------------------------------------------- random inputs


def random_samples(seed, num_samples=5):
    """Per sample: log-probs, old, rollout, ref, loss mask (a masked stretch), advantage."""
    rng = random.Random(seed)
    samples = []
    for i in range(num_samples):
        length = rng.randint(2, 7)
        old = [-rng.uniform(0.5, 4.0) for _ in range(length)]
        samples.append(
            SimpleNamespace(
                logp=[o + rng.gauss(0, 0.3) for o in old],
                old=old,
                rollout=[o + rng.gauss(0, 0.25) for o in old],
                ref=[o + rng.gauss(0, 0.5) for o in old],
                mask=[0.0 if (length > 4 and t == 1) else 1.0 for t in range(length)],
                adv=rng.uniform(-2, 2) * (-1) ** i,
            )
        )
    return samples


def packed(samples, pad=2):
    """One packed row (as the engine lays a micro-batch out) with `pad` trailing padding positions."""

    def row(values, fill=0.0):
        return torch.tensor([[v for values_ in values for v in values_] + [fill] * pad], dtype=torch.float64)

    index = torch.tensor([[i for i, s in enumerate(samples) for _ in s.mask] + [-1] * pad])
    return SimpleNamespace(
        logp=row([s.logp for s in samples]).requires_grad_(),
        old=row([s.old for s in samples]),
        rollout=row([s.rollout for s in samples]),
        ref=row([s.ref for s in samples]),
        mask=row([s.mask for s in samples]),
        adv=row([[s.adv] * len(s.mask) for s in samples]),
        index=index,
    )


def settings(**overrides):
    return from_dict(TrainerConfig, {"hf_checkpoint": "m", **overrides})


def policy_terms(samples, **overrides):
    p = packed(samples)
    inputs = LossInputs(
        log_probs=p.logp,
        loss_mask=p.mask,
        sample_index=p.index,
        settings=settings(**overrides),
        entropy=torch.zeros_like(p.logp),
        extras={
            "advantages": p.adv,
            "old_log_probs": p.old,
            "rollout_log_probs": p.rollout,
            "ref_log_probs": p.ref,
        },
    )
    return get_loss("policy_loss").fn(inputs), p


def unpack(tensor, samples):
    flat, out, k = tensor.detach().reshape(-1).tolist(), [], 0
    for s in samples:
        out.append(flat[k : k + len(s.mask)])
        k += len(s.mask)
    return out


def assert_per_token(actual, expected, samples):
    for got, want, s in zip(unpack(actual, samples), expected, samples, strict=True):
        for g, w, m in zip(got, want, s.mask, strict=True):
            if m:
                assert g == pytest.approx(w, rel=1e-5, abs=1e-6)


# ---------------------------------------------------------------- advantages


@pytest.mark.parametrize(
    "estimator", ["grpo", "gspo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]
)
@pytest.mark.parametrize("n", [1, 2, 5])
def test_group_part_of_every_estimator(estimator, n):
    rng = random.Random(n)
    rewards = [rng.choice([0.0, 1.0, rng.uniform(-1, 2)]) for _ in range(4 * n)]
    got = sequence_advantages(estimator, rewards, n)
    assert got.tolist() == pytest.approx(ref_group_part(estimator, rewards, n), rel=1e-9, abs=1e-12)
    got = sequence_advantages(estimator, rewards, n, disable_grpo_std_normalization=True)
    assert got.tolist() == pytest.approx(ref_group_part(estimator, rewards, n, std_normalization=False))
    got = sequence_advantages(estimator, rewards, n, disable_rewards_normalization=True)
    assert got.tolist() == pytest.approx(rewards)


def test_grpo_of_a_binary_pair_is_0707_not_1():
    # Issue 13: the population std made this +-1.0 (sqrt(n / (n - 1)) too large).
    assert sequence_advantages("grpo", [0.0, 1.0], 2).tolist() == pytest.approx([-0.70710, 0.70710], abs=1e-5)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_token_part_of_reinforce_plus_plus_and_its_baseline(gamma):
    samples = random_samples(3)
    kls = [[ref_kl(o, r, "k3") for o, r in zip(s.old, s.ref, strict=True)] for s in samples]
    returns, baselines, masks = [], [], []
    for s, kl in zip(samples, kls, strict=True):
        mask = torch.tensor(s.mask, dtype=torch.float64)
        ret = reinforce_plus_plus_returns(
            torch.full((len(s.mask),), s.adv, dtype=torch.float64),
            torch.tensor(kl, dtype=torch.float64),
            mask,
            0.2,
            gamma,
        )
        assert ret.tolist() == pytest.approx(ref_rpp_returns(s.adv, kl, s.mask, 0.2, gamma), rel=1e-9)
        base = reinforce_plus_plus_baseline(
            torch.full((len(kl),), s.adv, dtype=torch.float64), torch.tensor(kl, dtype=torch.float64), 0.2
        )
        assert base.tolist() == pytest.approx([s.adv - 0.2 * k for k in kl], rel=1e-9)
        returns.append(ret)
        baselines.append(base)
        masks.append(mask)
    whitened = whiten(returns, masks, distributed=False)
    expected = ref_whiten([r.tolist() for r in returns], [s.mask for s in samples])
    for got, want in zip(whitened, expected, strict=True):
        assert got.tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_the_trainer_completes_advantages_only_where_the_estimator_has_a_token_part():
    # One home: the coordinator's values stand unless the estimator has a token part or the run whitens.
    for estimator in ("grpo", "gspo", "dr_grpo", "rloo"):
        assert not completes_advantages(settings(advantage_estimator=estimator))
        assert completes_advantages(settings(advantage_estimator=estimator, normalize_advantages=True))
    for estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        assert completes_advantages(settings(advantage_estimator=estimator))
    base = settings()
    with pytest.raises(InvalidArgument, match="header.overrides.advantage_estimator: cannot be changed"):
        merge_settings(
            base, {"advantage_estimator": "reinforce_plus_plus"}, STEP_SETTINGS, "header.overrides"
        )


def test_the_run_refuses_a_trainer_with_another_estimator_or_dr_grpo_length():
    from rollway.coordinator.run_config import parse_run_config
    from rollway.coordinator.run_start import disagreements

    addresses = {"trainer_addr": "t:1", "rollout_addr": ["r:1"], "dataloader_addr": "d:1"}
    run = parse_run_config({"hf_checkpoint": "m", "advantage_estimator": "dr_grpo", **addresses})

    def reply(**trainer):
        return {"trainer": SimpleNamespace(settings=to_dict(settings(**trainer)), vocab_size=8)}

    assert disagreements(run, reply(advantage_estimator="dr_grpo")) == []
    assert disagreements(run, reply(advantage_estimator="grpo")) == [
        "advantage_estimator: the run has 'dr_grpo', the trainer has 'grpo'"
    ]
    assert disagreements(run, reply(advantage_estimator="dr_grpo", rollout_max_response_len=64)) == [
        "rollout_max_response_len: the run has 1024, the trainer has 64"
    ]


# ---------------------------------------------------------------- KL estimators


NON_FINITE = [
    (-math.inf, -1.0),
    (-1.0, -math.inf),
    (-math.inf, -math.inf),
    (math.nan, -1.0),
    (-1.0, -30.0),
    (-30.0, -1.0),
]


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_estimators_on_random_inputs(kind):
    rng = random.Random(7)
    pairs = [(-rng.uniform(0, 6), -rng.uniform(0, 6)) for _ in range(50)]
    got = approx_kl(torch.tensor([p for p, _ in pairs]), torch.tensor([o for _, o in pairs]), kind)
    assert got.tolist() == pytest.approx([ref_kl(p, o, kind) for p, o in pairs], rel=1e-5, abs=1e-6)


def test_low_var_kl_is_finite_and_clamped_for_non_finite_and_huge_log_ratios():
    lp = torch.tensor([p for p, _ in NON_FINITE])
    other = torch.tensor([o for _, o in NON_FINITE])
    got = approx_kl(lp, other, "low_var_kl")
    assert torch.isfinite(got).all()
    assert got.tolist() == pytest.approx([ref_kl(p, o, "low_var_kl") for p, o in NON_FINITE], rel=1e-5)
    # Log-ratios of +-29 between train and rollout: Miles reports the clamped low_var_kl, not
    # k3's 3.9e12 (train - rollout = 29) or 28 (rollout - train = 29).
    samples = random_samples(1, num_samples=1)
    shifts = [29.0 * (-1) ** t for t in range(len(samples[0].old))]
    samples[0].rollout = [o + d for o, d in zip(samples[0].old, shifts, strict=True)]
    terms, _ = policy_terms(samples)
    assert_per_token(terms["train_rollout_kl"], [[ref_kl(d, 0.0, "low_var_kl") for d in shifts]], samples)
    assert float(terms["train_rollout_kl"].max()) <= 10.0


# ---------------------------------------------------------------- policy losses


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"eps_clip": 0.1, "eps_clip_high": 0.28},
        {"eps_clip_c": 3.0},
        {"advantage_estimator": "gspo", "eps_clip": 0.05},
        {"advantage_estimator": "dr_grpo", "rollout_max_response_len": 16},
    ],
    ids=["ppo", "clip_higher", "dual_clip", "gspo", "dr_grpo"],
)
@pytest.mark.parametrize("per_token", [False, True])
def test_policy_loss_against_the_reference(options, per_token):
    if per_token and options.get("advantage_estimator") == "dr_grpo":
        from rollway.common.config import ConfigError

        with pytest.raises(ConfigError, match="calculate_per_token_loss: dr_grpo sums each sample"):
            settings(calculate_per_token_loss=True, **options).validate()
        return
    samples = random_samples(11)
    terms, p = policy_terms(samples, calculate_per_token_loss=per_token, **options)
    eps = options.get("eps_clip", 0.2)
    eps_high = options.get("eps_clip_high", eps)
    expected = []
    for s in samples:
        ratios = [lp - o for lp, o in zip(s.logp, s.old, strict=True)]
        if options.get("advantage_estimator") == "gspo":  # sequence ratio: mean over loss tokens
            mean = sum(r for r, m in zip(ratios, s.mask, strict=True) if m) / sum(s.mask)
            ratios = [mean] * len(ratios)
        losses = [ref_ppo(r, s.adv, eps, eps_high, options.get("eps_clip_c")) for r in ratios]
        if options.get("advantage_estimator") == "dr_grpo":  # token sum over a constant length
            losses = [x * sum(s.mask) / options["rollout_max_response_len"] for x in losses]
        expected.append(losses)
    assert_per_token(terms["pg_loss"], expected, samples)
    total = aggregate(
        terms["loss"], p.mask, p.index, GlobalDenominators(len(samples), int(p.mask.sum())), per_token
    )
    assert float(total.detach()) == pytest.approx(
        ref_aggregate(expected, [s.mask for s in samples], per_token), rel=1e-6
    )
    total.backward()
    assert torch.isfinite(p.logp.grad).all()


def test_kl_loss_and_entropy_terms():
    samples = random_samples(5)
    terms, _ = policy_terms(samples, use_kl_loss=True, kl_loss_coef=0.3, kl_loss_type="low_var_kl")
    kl = [[ref_kl(lp, r, "low_var_kl") for lp, r in zip(s.logp, s.ref, strict=True)] for s in samples]
    assert_per_token(terms["kl_loss"], kl, samples)
    pg = unpack(terms["pg_loss"], samples)
    assert_per_token(
        terms["loss"],
        [[a + 0.3 * b for a, b in zip(x, y, strict=True)] for x, y in zip(pg, kl, strict=True)],
        samples,
    )


# ---------------------------------------------------------------- rollout corrections


CORRECTIONS = {
    "tis": ({"use_tis": True, "tis_clip_low": 0.8, "tis_clip": 1.2}, "truncate", (0.8, 1.2)),
    "icepop": (
        {"use_tis": True, "tis_mode": "icepop", "tis_clip_low": 0.8, "tis_clip": 1.2},
        "icepop",
        (0.8, 1.2),
    ),
    "mis_token": ({"use_mis": True, "mis_low": 0.8, "mis_high": 1.25}, "mis_token", (0.8, 1.25)),
    "mis_sequence": (
        {"use_mis": True, "mis_level": "sequence", "mis_low": 0.6, "mis_high": 1.6},
        "mis_sequence",
        (0.6, 1.6),
    ),
    "geo_mask": ({"use_geo_mask": True, "geo_mask_low": 0.9, "geo_mask_high": 1.1}, "geo", (0.9, 1.1)),
}


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_rollout_corrections_against_the_reference(name):
    options, kind, (low, high) = CORRECTIONS[name]
    samples = random_samples(21, num_samples=8)
    plain, _ = policy_terms(samples)
    terms, _ = policy_terms(samples, **options)
    weights = [ref_weights(kind, s.old, s.rollout, s.mask, low, high) for s in samples]
    flat = [w for ws, s in zip(weights, samples, strict=True) for w, m in zip(ws, s.mask, strict=True) if m]
    # Both corrected and untouched tokens, so that the test can fail.
    corrected = {low, high} if kind == "truncate" else {0.0}
    assert any(w in corrected for w in flat) and any(w not in corrected for w in flat)
    pg = unpack(plain["pg_loss"], samples)
    assert_per_token(
        terms["pg_loss"],
        [[a * w for a, w in zip(x, y, strict=True)] for x, y in zip(pg, weights, strict=True)],
        samples,
    )
    masked = [[1.0 if w == 0.0 else 0.0 for w in ws] for ws in weights]
    metric = {"icepop": "tis_clipfrac", "mis_token": "mis_masked_frac", "mis_sequence": "mis_masked_frac"}
    if kind == "truncate":
        ratios = [[math.exp(o - r) for o, r in zip(s.old, s.rollout, strict=True)] for s in samples]
        assert_per_token(terms["tis"], ratios, samples)
        clipped = [[1.0 if not low <= x <= high else 0.0 for x in xs] for xs in ratios]
        assert_per_token(terms["tis_clipfrac"], clipped, samples)
    elif kind == "geo":
        assert_per_token(terms["geo_mask_masked_frac"], masked, samples)
        geo = [
            math.exp(sum(o - r for o, r, m in zip(s.old, s.rollout, s.mask, strict=True) if m) / sum(s.mask))
            for s in samples
        ]
        assert_per_token(
            terms["geo_mask_ratio"], [[g] * len(s.mask) for g, s in zip(geo, samples, strict=True)], samples
        )
        below = [[1.0 if g < low else 0.0] * len(s.mask) for g, s in zip(geo, samples, strict=True)]
        assert_per_token(terms["geo_mask_below_frac"], below, samples)
    else:
        assert_per_token(terms[metric[name]], masked, samples)


def test_geo_mask_combines_with_tis_and_corrections_need_the_trainers_old_policy():
    samples = random_samples(21, num_samples=8)
    plain, _ = policy_terms(samples)
    terms, _ = policy_terms(samples, **CORRECTIONS["tis"][0], **CORRECTIONS["geo_mask"][0])
    tis = [ref_weights("truncate", s.old, s.rollout, s.mask, 0.8, 1.2) for s in samples]
    geo = [ref_weights("geo", s.old, s.rollout, s.mask, 0.9, 1.1) for s in samples]
    pg = unpack(plain["pg_loss"], samples)
    expected = [
        [a * b * c for a, b, c in zip(x, y, z, strict=True)] for x, y, z in zip(pg, tis, geo, strict=True)
    ]
    assert_per_token(terms["pg_loss"], expected, samples)
    from rollway.common.config import ConfigError

    for option in ("use_tis", "use_mis", "use_geo_mask"):
        with pytest.raises(ConfigError, match=f"{option}: cannot be combined with use_rollout_logprobs"):
            settings(**{option: True, "use_rollout_logprobs": True}).validate()
    with pytest.raises(ConfigError, match="use_mis: use_tis and use_mis are both"):
        settings(use_tis=True, use_mis=True).validate()


# ---------------------------------------------------------------- SFT loss and aggregation


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("loss_type", ["sft_loss", "policy_loss"])
def test_aggregation_is_the_same_for_one_or_several_micro_batches(loss_type, per_token):
    samples = random_samples(4, num_samples=6)
    denominators = GlobalDenominators(len(samples), int(sum(sum(s.mask) for s in samples)))
    if loss_type == "sft_loss":
        expected = [[-lp for lp in s.logp] for s in samples]
    else:
        expected = [
            [ref_ppo(lp - o, s.adv, 0.2, 0.2) for lp, o in zip(s.logp, s.old, strict=True)] for s in samples
        ]
    reference = ref_aggregate(expected, [s.mask for s in samples], per_token)
    for split in ([samples], [samples[:1], samples[1:4], samples[4:]], [[s] for s in samples]):
        total, offset = 0.0, 0
        for part in split:
            terms, p = policy_terms(part, loss_type=loss_type, calculate_per_token_loss=per_token)
            if loss_type == "sft_loss":
                terms = get_loss("sft_loss").fn(LossInputs(p.logp, p.mask, p.index, settings()))
            total += float(
                aggregate(
                    terms["loss"].detach(), p.mask, p.index + (p.index >= 0) * offset, denominators, per_token
                )
            )
            offset += len(part)
        assert total == pytest.approx(reference, rel=1e-9)


def test_ratio_extremes_are_the_range_over_every_micro_batch():
    from rollway.trainer.loss.losses import combine_shares, metric_share

    samples = random_samples(21, num_samples=8)
    options = {"use_mis": True, "mis_level": "sequence", "mis_low": 0.6, "mis_high": 1.6}
    ratios = [
        [math.exp(o - r) for o, r, m in zip(s.old, s.rollout, s.mask, strict=True) if m] for s in samples
    ]
    sequence = [math.prod(xs) for xs in ratios]
    denominators = GlobalDenominators(len(samples), 0)
    for split in ([samples], [samples[:3], samples[3:]]):
        totals = {}
        for part in split:
            terms, p = policy_terms(part, **options)
            for name in ("mis_ratio_min", "mis_ratio_max", "tis_min", "tis_max"):
                if name in terms:
                    share = metric_share(name, terms[name], p.mask, p.index, denominators, False)
                    totals[name] = combine_shares(name, totals.get(name), share)
        assert "tis_min" not in totals
        assert float(totals["mis_ratio_min"]) == pytest.approx(min(sequence), rel=1e-5)
        assert float(totals["mis_ratio_max"]) == pytest.approx(max(sequence), rel=1e-5)
    terms, p = policy_terms(samples, use_tis=True)
    share = metric_share("tis_max", terms["tis_max"], p.mask, p.index, denominators, False)
    assert float(share) == pytest.approx(max(max(xs) for xs in ratios), rel=1e-5)
