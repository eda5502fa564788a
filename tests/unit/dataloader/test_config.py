"""DataloaderConfig validation: configuration mistakes name the setting."""

import pytest

from rollway.common.config import ConfigError, from_dict
from rollway.dataloader.config import DataloaderConfig

BASE = {"hf_checkpoint": "/m", "prompt_data": ["d.jsonl"]}


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"hf_checkpoint": ""}, "hf_checkpoint"),
        ({"prompt_data": []}, "prompt_data"),
        ({"prompt_data": ["a", "x.jsonl", "b"]}, "prompt_data"),
        (
            {"prompt_data": ["a", "x.jsonl", "b", "y.jsonl"], "prompt_data_weights": [1.0]},
            "prompt_data_weights",
        ),
        ({"eval_prompt_data": ["only_a_name"]}, "eval_prompt_data"),
        ({"num_epoch": -1}, "num_epoch"),
        ({"prefetch_size": -1}, "prefetch_size"),
        ({"mode": "sft"}, "apply_chat_template"),
        ({"loss_type": "sft_loss"}, "apply_chat_template"),
        ({"chat_template_path": "t.jinja"}, "chat_template_path"),
        ({"mode": "pretrain"}, "mode"),
    ],
)
def test_config_errors_name_the_setting(overrides, setting):
    with pytest.raises(ConfigError) as info:
        from_dict(DataloaderConfig, {**BASE, **overrides})
    assert info.value.setting == setting


def test_mode_follows_loss_type_unless_set():
    assert not from_dict(DataloaderConfig, BASE).is_sft
    sft = {**BASE, "apply_chat_template": True}
    assert from_dict(DataloaderConfig, {**sft, "loss_type": "sft_loss"}).is_sft
    assert not from_dict(DataloaderConfig, {**sft, "loss_type": "sft_loss", "mode": "rl"}).is_sft
    assert from_dict(DataloaderConfig, {**sft, "mode": "sft"}).is_sft
