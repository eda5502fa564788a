"""Trainer settings: validation, and what Init and TrainStep headers may change."""

from __future__ import annotations

import pytest

from rollway.common.config import ConfigError, from_dict
from rollway.common.errors import InvalidArgument
from rollway.trainer.config import STEP_SETTINGS, TRAINING_SETTINGS, TrainerConfig
from rollway.trainer.controller import merge_settings


def test_hf_checkpoint_is_required():
    with pytest.raises(ConfigError, match="hf_checkpoint"):
        from_dict(TrainerConfig, {})


@pytest.mark.parametrize(
    "overrides, setting",
    [
        ({"lr_decay_style": "cosine"}, "lr_decay_iters"),
        ({"micro_batch_size": -1}, "micro_batch_size"),
        ({"adam_beta2": 1.0}, "adam_beta2"),
        ({"min_lr": 1.0, "lr": 0.5}, "min_lr"),
        ({"loss_type": "ppo"}, "loss_type"),
        ({"world_size": 0}, "world_size"),
        ({"attn_implementation": "flash_attention_2"}, "attn_implementation"),  # flash-attn not installed
    ],
)
def test_bad_settings_name_the_setting(overrides, setting):
    with pytest.raises(ConfigError) as err:
        from_dict(TrainerConfig, {"hf_checkpoint": "m", **overrides})
    assert err.value.setting == setting


def test_init_may_change_hyper_parameters_but_not_the_model():
    base = TrainerConfig(hf_checkpoint="m")
    merged = merge_settings(base, {"lr": 3e-4, "lr-warmup-iters": 5.0}, TRAINING_SETTINGS, "config")
    assert (merged.lr, merged.lr_warmup_iters) == (3e-4, 5)
    # Repeating a start-up setting's current value is fine (a coordinator may send everything).
    assert merge_settings(base, {"hf_checkpoint": "m", "dtype": "auto"}, TRAINING_SETTINGS, "config") == base
    with pytest.raises(InvalidArgument, match=r"config\.dtype: cannot be changed here"):
        merge_settings(base, {"dtype": "float32"}, TRAINING_SETTINGS, "config")
    with pytest.raises(InvalidArgument, match=r"config\.lrr: unknown setting.*did you mean lr"):
        merge_settings(base, {"lrr": 1.0}, TRAINING_SETTINGS, "config")
    with pytest.raises(InvalidArgument, match=r"config\.lr: must be a number"):
        merge_settings(base, {"lr": "fast"}, TRAINING_SETTINGS, "config")


def test_step_overrides_are_loss_settings_only():
    base = TrainerConfig(hf_checkpoint="m")
    assert merge_settings(
        base, {"calculate_per_token_loss": True}, STEP_SETTINGS, "header.overrides"
    ).calculate_per_token_loss
    with pytest.raises(InvalidArgument, match=r"header\.overrides\.lr: cannot be changed here"):
        merge_settings(base, {"lr": 1.0}, STEP_SETTINGS, "header.overrides")


def test_batching_is_by_token_budget_unless_a_micro_batch_size_is_set():
    def config(**overrides):
        return from_dict(TrainerConfig, {"hf_checkpoint": "/m", **overrides})

    assert config().dynamic_batching  # a config that says nothing about batching: the fast path
    fixed = config(micro_batch_size=4)
    assert not fixed.dynamic_batching and fixed.samples_per_micro_batch == 4
    assert config(micro_batch_size=4, use_dynamic_batch_size=True).dynamic_batching
    off = config(use_dynamic_batch_size=False)
    assert not off.dynamic_batching and off.samples_per_micro_batch == 1
