"""Shared prefixes on a real FSDP2 engine (one gloo rank, spawned): every policy-loss metric, the
log-probs and every gradient equal those of each sample run alone, for sdpa and eager attention.
The in-process checks and the batch they share are in tests/unit/trainer/test_shared_prompts.py."""

from __future__ import annotations

import pytest
import torch
from support.rl_harness import make_config, new_engine, run_scenarios, step_gradients
from support.rl_scenarios import log_probs
from transformers import AutoModelForCausalLM
from unit.trainer.test_shared_prompts import (
    ITEMS,
    SHARED,
    TEMPERATURE,
    alone_log_probs,
    one_thread,  # noqa: F401 (autouse: reference forwards on one thread)
)

from rollway.common.config import from_dict
from rollway.trainer.config import TrainerConfig

ALONE = {"micro_batch_size": 1}  # one sample per micro-batch: nothing shared
PADDED = {"packing": False, "micro_batch_size": 4}
OPTIONS = {
    "grpo": {"rollout_temperature": TEMPERATURE},
    "gspo_per_token": {"advantage_estimator": "gspo", "calculate_per_token_loss": True},
    "full": {
        "use_tis": True,
        "use_kl_loss": True,
        "kl_loss_coef": 0.3,
        "entropy_coef": 0.01,
        "eps_clip_high": 0.28,
        "num_steps_per_rollout": 2,  # the old-policy pre-pass
    },
}
SPLITS = {"alone": ALONE, "shared": SHARED, "padded": PADDED}
VARIANTS = {
    # eager: the shared prompt through the explicit mask (the layout itself is sdpa's test).
    "eager": {f"grpo/{s}": {**OPTIONS["grpo"], **SPLITS[s]} for s in ("alone", "shared")},
    "sdpa": {f"{o}/{s}": {**OPTIONS[o], **SPLITS[s]} for o in OPTIONS for s in SPLITS},
}


def scenario_shared(info, model_dir: str, items, attn: str, variants: dict) -> dict:
    """Per variant (metrics, gradients) of one step, and the ComputeLogProbs log-probs."""
    config = make_config(model_dir, attn_implementation=attn)
    engine = new_engine(info, config)
    results = {
        name: step_gradients(engine, items, from_dict(TrainerConfig, overrides, base=config))
        for name, overrides in variants.items()
    }
    results["log_probs"] = log_probs(engine, items, use_reference=False)
    return results


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def engine_results(request, tiny_model_dir, tmp_path_factory):
    attn = request.param
    scenario = {"model_dir": str(tiny_model_dir), "items": ITEMS, "attn": attn, "variants": VARIANTS[attn]}
    return run_scenarios(1, [(scenario_shared, scenario)], tmp_path_factory.mktemp("shared"))[0]


@pytest.mark.parametrize("option", list(OPTIONS))
def test_shared_prompts_give_the_same_metrics_and_gradients(engine_results, option):
    if f"{option}/alone" not in engine_results:
        pytest.skip("runs with sdpa only")
    alone_metrics, alone_grads = engine_results[f"{option}/alone"]
    for split in ("shared", "padded"):
        if f"{option}/{split}" not in engine_results:
            continue
        metrics, grads = engine_results[f"{option}/{split}"]
        assert metrics.keys() == alone_metrics.keys()
        for name, value in alone_metrics.items():
            assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), f"{split}: {name}"
        for name, grad in alone_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=f"{split}: {name}")


def test_grpo_gradient_and_log_probs_equal_plain_per_sample_transformers(engine_results, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for item in ITEMS:
            expected = alone_log_probs(model, item).tolist()
            assert engine_results["log_probs"][item.index] == pytest.approx(expected, abs=2e-5)
    _, grads = engine_results["grpo/shared"]
    loss = 0.0
    for item in ITEMS:
        logp = alone_log_probs(model, item, TEMPERATURE)
        mask = torch.tensor(item.loss_mask, dtype=torch.float32)
        advantage = item.extras["advantages"][0]
        loss = loss + (-advantage * logp * mask).sum() / mask.sum().clamp(min=1) / len(ITEMS)
    loss.backward()  # the PPO loss at ratio 1 has the gradient of -A * log p (not its value)
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
