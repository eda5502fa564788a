"""rollway's RL losses on 1 and 2 real FSDP2 ranks equal the references of
tests/unit/trainer/test_fidelity.py (written from the papers), with the same gradients."""

from __future__ import annotations

import pytest
import torch
from support.rl_harness import run_scenarios
from support.rl_scenarios import rl_batch, scenario_gradients
from unit.trainer.test_fidelity import ref_aggregate, ref_whiten


def test_dr_grpo_and_whitened_losses_are_the_reference_on_one_or_two_ranks(tiny_model_dir, tmp_path):
    items = rl_batch(0)
    runs = {
        "dr_grpo": {"advantage_estimator": "dr_grpo", "rollout_max_response_len": 20},
        "whitened": {"normalize_advantages": True},
        "whitened_per_token": {"normalize_advantages": True, "calculate_per_token_loss": True},
    }
    # A geometric mask so wide that it keeps everything: its weight (1) is computed and applied.
    wide = {"use_geo_mask": True, "geo_mask_low": 0.0, "geo_mask_high": 1e30}
    splits = {"mbs1": {"micro_batch_size": 1}, "dynamic": {**wide, "max_tokens_per_gpu": 40}}
    variants = {f"{r}/{s}": {**runs[r], **splits[s]} for r in runs for s in splits}
    scenario = [
        (scenario_gradients, {"model_dir": str(tiny_model_dir), "items": items, "variants": variants})
    ]
    two = run_scenarios(2, scenario, tmp_path)[0]
    one = run_scenarios(1, scenario, tmp_path)[0]
    # Step 0: old = current, so the ratio is 1 and pg = -A per token.
    masks = [item.loss_mask for item in items]
    advantages = [item.extras["advantages"] for item in items]
    whitened = ref_whiten(advantages, masks)
    negated = lambda values: [[-a for a in adv] for adv in values]  # noqa: E731
    dr_grpo = [[-a * sum(mask) / 20 for a in adv] for adv, mask in zip(advantages, masks, strict=True)]
    expected = {
        "dr_grpo": ref_aggregate(dr_grpo, masks, per_token=False),
        "whitened": ref_aggregate(negated(whitened), masks, per_token=False),
        "whitened_per_token": ref_aggregate(negated(whitened), masks, per_token=True),
    }
    assert expected["whitened_per_token"] == pytest.approx(0.0, abs=1e-9)  # whitened: mean 0 over tokens
    assert min(abs(expected["dr_grpo"]), abs(expected["whitened"])) > 0.01
    for name in variants:
        run = name.split("/")[0]
        for result in (two, one):
            assert result[name][0]["train/pg_loss"] == pytest.approx(expected[run], rel=1e-5, abs=1e-7), name
        for param, grad in two[name][1].items():
            torch.testing.assert_close(grad, one[f"{run}/mbs1"][1][param], rtol=1e-4, atol=1e-6)
        assert two[name][0].keys() == one[name][0].keys()
        for metric, value in two[name][0].items():  # sums and ranges (geo_mask_ratio_min/max) alike
            assert value == pytest.approx(one[name][0][metric], rel=1e-5, abs=1e-7), (name, metric)
    assert two["dr_grpo/dynamic"][0]["train/geo_mask_masked_frac"] == 0.0
    assert (
        0
        < two["dr_grpo/dynamic"][0]["train/geo_mask_ratio_min"]
        < two["dr_grpo/dynamic"][0]["train/geo_mask_ratio_max"]
    )
