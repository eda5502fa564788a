"""policy_loss on real FSDP2 shards over gloo: 2 spawned ranks, then 1.

Invariance (fp32): every policy-loss metric and every parameter's gradient is the same for 1 or
2 ranks and for any micro-batch split, for each estimator and option (GRPO per sample and per
token, GSPO, TIS + KL loss + entropy + clip-higher + dual clip with the old-log-prob pre-pass,
reinforce++ and its baseline with KL shaping), and equal to plain transformers for GRPO with a
rollout temperature. At step 0 the policy's log-probs equal the reference's exactly and the KL
loss is 0. TiledMLP gives the untiled gradients under FSDP2. LoRA trains only the adapters and
its merged HF export equals base + delta (and what peft itself merges).
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from support.rl_harness import run_scenarios
from support.rl_scenarios import (
    rl_batch,
    scenario_gradients,
    scenario_lora,
    scenario_step0,
    scenario_tiled,
)
from transformers import AutoModelForCausalLM

from rollway.common.weights_checksum import weights_checksum

pytestmark = pytest.mark.slow

SPLITS = {
    "mbs1": {"micro_batch_size": 1},
    "dynamic": {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 40},
    "padded": {"packing": False, "micro_batch_size": 2},
}
OPTIONS = {
    "grpo": {},
    "grpo_per_token": {"calculate_per_token_loss": True},
    "gspo": {"advantage_estimator": "gspo"},
    "full": {
        "use_tis": True,
        "tis_clip": 1.5,
        "tis_clip_low": 0.5,
        "use_kl_loss": True,
        "kl_loss_coef": 0.3,
        "kl_loss_type": "low_var_kl",
        "entropy_coef": 0.01,
        "eps_clip_high": 0.28,
        "eps_clip_c": 3.0,
        "num_steps_per_rollout": 2,
    },
    "rpp": {
        "advantage_estimator": "reinforce_plus_plus",
        "kl_coef": 0.2,
        "gamma": 0.9,
        "kl_loss_type": "k3",
        "normalize_advantages": True,
    },
    "rppb": {
        "advantage_estimator": "reinforce_plus_plus_baseline",
        "kl_coef": 0.2,
        "normalize_advantages": True,
    },
}
VARIANTS = {f"{o}/{s}": {**OPTIONS[o], **SPLITS[s]} for o in OPTIONS for s in SPLITS}
VARIANTS["grpo_temperature"] = {"rollout_temperature": 0.7, "micro_batch_size": 3}
ITEMS = rl_batch(0)
TILED = {
    "plain": {"loss_type": "sft_loss"},
    "tiled": {"loss_type": "sft_loss", "tiled_mlp": True, "tiled_mlp_shards": 3},
    "tiled_checkpointed": {
        "loss_type": "sft_loss",
        "tiled_mlp": True,
        "tiled_mlp_shards": 2,
        "gradient_checkpointing": True,
    },
    "tiled_policy": {"tiled_mlp": True, "tiled_mlp_shards": 4, "micro_batch_size": 2},
    "plain_policy": {"micro_batch_size": 2},
}


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rl-ranks")
    model = str(tiny_model_dir)
    two = run_scenarios(
        2,
        [
            (scenario_gradients, {"model_dir": model, "items": ITEMS, "variants": VARIANTS}),
            (scenario_step0, {"model_dir": model, "items": ITEMS}),
            (scenario_tiled, {"model_dir": model, "items": ITEMS, "variants": TILED}),
            (scenario_lora, {"model_dir": model, "items": ITEMS, "out_dir": str(tmp / "lora")}),
        ],
        tmp,
    )
    one = run_scenarios(
        1, [(scenario_gradients, {"model_dir": model, "items": ITEMS, "variants": VARIANTS})], tmp
    )
    return {"two": two, "one": one[0], "lora_dir": tmp / "lora"}


def assert_same(a, b, what: str):
    (metrics_a, grads_a), (metrics_b, grads_b) = a[:2], b[:2]
    assert metrics_a.keys() == metrics_b.keys(), what
    for name in metrics_a:
        assert metrics_a[name] == pytest.approx(metrics_b[name], rel=1e-5, abs=1e-6), f"{what}: {name}"
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6, msg=f"{what}: {name}")


@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_policy_loss_option_is_invariant_to_ranks_and_micro_batches(results, option):
    two, one = results["two"][0], results["one"]
    first = two[f"{option}/mbs1"]
    for split in SPLITS:
        assert_same(first, two[f"{option}/{split}"], f"2 ranks {option}/{split}")
        assert_same(first, one[f"{option}/{split}"], f"1 rank {option}/{split}")
    metrics = first[0]
    expected = {"train/loss", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl", "train/entropy_loss"}
    expected |= {
        "train/train_rollout_logprob_abs_diff",
        "train/train_rollout_kl",
        "train/loss/a",
        "train/loss/b",
    }
    if option == "full":
        expected |= {"train/tis", "train/tis_min", "train/tis_max", "train/tis_clipfrac", "train/kl_loss"}
    assert expected <= metrics.keys()
    assert metrics["train/ppo_kl"] == 0.0  # old log-probs (own forward or the detached current) = current


def test_metrics_at_step_0_have_the_expected_values(results):
    grpo, full = results["two"][0]["grpo/mbs1"][0], results["two"][0]["full/mbs1"][0]
    # Ratio 1: pg_loss is minus the mean advantage per sample; sources a (even) and b (odd) apart.
    advantages = [item.extras["advantages"][0] for item in ITEMS]
    assert grpo["train/pg_loss"] == pytest.approx(-sum(advantages) / len(advantages), rel=1e-6)
    assert grpo["train/loss/a"] == pytest.approx(-sum(advantages[0::2]) / 3, rel=1e-6)
    assert grpo["train/loss/b"] == pytest.approx(-sum(advantages[1::2]) / 3, rel=1e-6)
    assert grpo["train/pg_clipfrac"] == 0.0 and full["train/kl_loss"] == 0.0
    # TIS on the first optimizer step (samples 0-2 of 2 steps): per-sample means of the raw
    # weight exp(old - rollout) and of the clip indicator for [0.5, 1.5], from the policy's log-probs.
    old = results["two"][1]["before"][0]
    tis, clipped, diff, weights = [], [], [], []
    for item in ITEMS[:3]:
        pairs = [
            (math.exp(o - r), abs(o - r))
            for o, r, m in zip(old[item.index], item.extras["rollout_log_probs"], item.loss_mask, strict=True)
            if m
        ]
        tis.append(sum(w for w, _ in pairs) / len(pairs))
        weights += [w for w, _ in pairs]
        clipped.append(sum(not 0.5 <= w <= 1.5 for w, _ in pairs) / len(pairs))
        diff.append(sum(d for _, d in pairs) / len(pairs))
    assert full["train/tis"] == pytest.approx(sum(tis) / 3, rel=1e-4)
    # The range over every loss token of the step, on both ranks (a MAX all-reduce, not a sum).
    assert (full["train/tis_min"], full["train/tis_max"]) == pytest.approx(
        (min(weights), max(weights)), rel=1e-4
    )
    assert full["train/tis_clipfrac"] == pytest.approx(sum(clipped) / 3, rel=1e-4)
    assert full["train/train_rollout_logprob_abs_diff"] == pytest.approx(sum(diff) / 3, rel=1e-4)
    assert 0 < full["train/tis_clipfrac"] < 1


def test_grpo_gradient_equals_plain_transformers_with_the_rollout_temperature(results, tiny_model_dir):
    metrics, grads = results["two"][0]["grpo_temperature"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    loss = 0.0
    for item in ITEMS:
        ids = torch.tensor([item.token_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float() / 0.7, -1)
        logp = logp.gather(-1, ids[0, 1:, None])[item.response_start - 1 :, 0]
        mask = torch.tensor(item.loss_mask, dtype=torch.float32)
        advantage = item.extras["advantages"][0]
        loss = loss + (-advantage * logp * mask).sum() / mask.sum() / len(ITEMS)
    loss.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_policy_equals_reference_exactly_at_step_0_and_moves_away_after(results):
    step0 = results["two"][1]
    policy, reference = step0["before"]
    assert policy == reference  # bit for bit
    first, second = step0["metrics"]
    assert (
        first["train/kl_loss"] == 0.0 and first["train/ppo_kl"] == 0.0 and first["train/pg_clipfrac"] == 0.0
    )
    assert second["train/kl_loss"] != 0.0  # the second step trains on moved weights
    policy_after, reference_after = step0["after"]
    assert reference_after == reference  # the reference never trains
    assert max(abs(a - b) for i in policy for a, b in zip(policy[i], policy_after[i], strict=True)) > 1e-3


def test_tiled_mlp_gradients_equal_the_untiled_ones_under_fsdp2(results):
    tiled = results["two"][2]
    assert tiled["tiled"][2] == tiled["tiled_policy"][2] == 4 and tiled["plain"][2] == 0  # MLPs tiled
    assert_same(tiled["plain"], tiled["tiled"], "tiled sft")
    assert_same(tiled["plain"], tiled["tiled_checkpointed"], "tiled + gradient checkpointing")
    assert_same(tiled["plain_policy"], tiled["tiled_policy"], "tiled policy loss")


def test_lora_trains_only_the_adapters_and_exports_base_plus_delta(results, tiny_model_dir):
    lora = results["two"][3]
    before, after = lora["before"], lora["after"]
    assert lora["trainable"] == sorted(lora["adapter_names"]) and lora["optimized"] == len(
        lora["adapter_names"]
    )
    for name in before:
        if name in lora["adapter_names"]:
            continue
        assert torch.equal(before[name], after[name]), f"{name} changed"
    assert any(not torch.equal(before[n], after[n]) for n in lora["adapter_names"] if ".lora_B." in n)
    # The reference of a LoRA run is the base model: the step-0 policy, unchanged by training.
    policy_before, ref_before, ref_after = lora["ref"]
    assert ref_before == policy_before and ref_after == ref_before

    checkpoint = results["lora_dir"]
    exported = load_file(str(checkpoint / "hf" / "model.safetensors"))
    # A weight push sends the merged weights under HF names, and its planned checksums hold.
    planned, gathered, pushed = lora["pushed"]
    assert planned == gathered
    assert sorted(pushed) == sorted(exported)
    assert all(torch.equal(pushed[name], exported[name]) for name in exported)
    adapter = load_file(str(checkpoint / "adapter" / "adapter_model.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    scaling = 8.0 / 4
    merged_modules = 0
    for name, value in exported.items():
        key_a = "base_model.model." + name.replace(".weight", ".lora_A.weight")
        expected = base[name]
        if key_a in adapter:
            delta = adapter[key_a.replace("lora_A", "lora_B")] @ adapter[key_a]
            expected = expected + scaling * delta
            merged_modules += 1
        torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-7, msg=name)
    assert merged_modules == 7 * 4  # q k v o gate up down in every layer
    # WeightChecksum (and so weight pushes) see the merged weights too.
    assert lora["checksum"] == weights_checksum(exported.items(), torch.float32)


def test_peft_loads_the_adapter_and_merges_to_the_export(results, tiny_model_dir):
    from peft import PeftModel

    checkpoint = results["lora_dir"]
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(checkpoint / "adapter")).merge_and_unload().state_dict()
    exported = load_file(str(checkpoint / "hf" / "model.safetensors"))
    for name, value in exported.items():
        torch.testing.assert_close(merged[name], value, rtol=1e-6, atol=1e-7, msg=name)
    assert not math.isnan(results["two"][3]["metrics"][-1]["train/loss"])
