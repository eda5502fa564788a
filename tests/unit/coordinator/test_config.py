"""Run config validation names the setting."""

import pytest

from rollway.common.config import ConfigError, from_dict
from rollway.coordinator.config import CoordinatorConfig


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"rollout_batch_size": 3, "n_samples_per_prompt": 3, "global_batch_size": 4}, "global_batch_size"),
        ({"advantage_estimator": "ppo"}, "advantage_estimator"),
        ({"rollout_batch_size": 0}, "rollout_batch_size"),
        ({"debug_rollout_only": True, "debug_train_only": True}, "debug_rollout_only"),
        ({"eval_prompt_data": ["only-a-name"]}, "eval_prompt_data"),
        ({"max_weight_staleness": 0}, "max_weight_staleness"),
        ({"dynamic_sampling_filter_path": "my.module.fn"}, "dynamic_sampling_filter_path"),
        ({"partial_rollout": True}, "partial_rollout"),
        ({"mask_offpolicy_in_partial_rollout": True}, "mask_offpolicy_in_partial_rollout"),
        ({"save_total_limit": -1}, "save_total_limit"),
    ],
)
def test_bad_settings_are_named(settings, name):
    with pytest.raises(ConfigError) as err:
        from_dict(CoordinatorConfig, settings)
    assert err.value.setting == name


def test_async_alias_and_batch_arithmetic():
    config = from_dict(
        CoordinatorConfig,
        {"async": True, "rollout_batch_size": 4, "n_samples_per_prompt": 8, "global_batch_size": 16},
    )
    assert config.async_mode and config.samples_per_rollout == 32
    sft = from_dict(
        CoordinatorConfig, {"loss_type": "sft_loss", "rollout_batch_size": 16, "global_batch_size": 16}
    )
    assert sft.samples_per_rollout == 16 and sft.train_only
