"""RL settings of the trainer: defaults shared with the coordinator, validation naming the setting,
what Init and TrainStep headers may change, flags."""

from __future__ import annotations

import pytest

from rollway.common.config import ConfigError, check_shared_settings, from_dict, parse
from rollway.common.errors import InvalidArgument
from rollway.coordinator.config import CoordinatorConfig
from rollway.dataloader.config import DataloaderConfig
from rollway.rollout.config import RolloutConfig
from rollway.trainer.config import STEP_SETTINGS, TRAINING_SETTINGS, TrainerConfig
from rollway.trainer.controller import merge_settings
from rollway.trainer.loss.losses import get_loss


def test_defaults_match_every_component_that_shares_a_setting():
    check_shared_settings([CoordinatorConfig, DataloaderConfig, RolloutConfig, TrainerConfig])
    config = TrainerConfig(hf_checkpoint="m")
    assert (config.loss_type, config.advantage_estimator, config.rollout_temperature) == (
        "policy_loss",
        "grpo",
        1.0,
    )
    assert (config.eps_clip, config.eps_clip_high, config.eps_clip_c) == (0.2, None, None)
    assert (config.tis_clip, config.tis_clip_low, config.gamma, config.kl_loss_type) == (2.0, 0.0, 1.0, "k1")
    assert get_loss("policy_loss").per_token_inputs == ("advantages",)


@pytest.mark.parametrize(
    "overrides, setting",
    [
        ({"use_kl_loss": True, "kl_coef": 0.1, "advantage_estimator": "reinforce_plus_plus"}, "kl_coef"),
        ({"kl_coef": 0.1}, "kl_coef"),  # grpo: the penalty has no token-level returns to shape
        ({"eps_clip_c": 1.0}, "eps_clip_c"),
        ({"eps_clip_high": -0.1}, "eps_clip_high"),
        ({"tis_clip": 0.5, "tis_clip_low": 1.0}, "tis_clip"),
        ({"gamma": 1.5}, "gamma"),
        ({"kl_loss_type": "k4"}, "kl_loss_type"),
        ({"advantage_estimator": "ppo"}, "advantage_estimator"),
        ({"rollout_temperature": 0.0}, "rollout_temperature"),
        ({"lora_rank": -1}, "lora_rank"),
        ({"lora_rank": 4, "lora_alpha": 0.0}, "lora_alpha"),
        ({"tiled_mlp_shards": -2}, "tiled_mlp_shards"),
    ],
)
def test_bad_rl_settings_name_the_setting(overrides, setting):
    with pytest.raises(ConfigError) as err:
        from_dict(TrainerConfig, {"hf_checkpoint": "m", **overrides})
    assert err.value.setting == setting


def test_kl_penalty_and_kl_loss_each_alone_are_fine():
    from_dict(
        TrainerConfig, {"hf_checkpoint": "m", "advantage_estimator": "reinforce_plus_plus", "kl_coef": 0.1}
    )
    from_dict(TrainerConfig, {"hf_checkpoint": "m", "use_kl_loss": True, "kl_loss_coef": 0.1})
    # A greedy rollout temperature is fine for SFT runs, which never divide by it.
    from_dict(TrainerConfig, {"hf_checkpoint": "m", "loss_type": "sft_loss", "rollout_temperature": 0.0})


def test_flags_parse_optional_clips_and_lists():
    config = parse(
        TrainerConfig,
        [
            "--hf-checkpoint",
            "m",
            "--eps-clip-high",
            "0.28",
            "--lora-target-modules",
            "q_proj",
            "v_proj",
            "--use-tis",
        ],
    )
    assert (config.eps_clip_high, config.lora_target_modules, config.use_tis) == (
        0.28,
        ["q_proj", "v_proj"],
        True,
    )


def test_init_and_headers_may_change_rl_settings_but_not_the_model_shape():
    base = TrainerConfig(hf_checkpoint="m")
    merged = merge_settings(base, {"eps_clip": 0.1, "use_tis": True}, STEP_SETTINGS, "header.overrides")
    assert (merged.eps_clip, merged.use_tis) == (0.1, True)
    for setting, value in (("lora_rank", 8), ("ref_load", "other"), ("tiled_mlp", True)):
        assert setting not in TRAINING_SETTINGS
        with pytest.raises(InvalidArgument, match=f"config.{setting}: cannot be changed"):
            merge_settings(base, {setting: value}, TRAINING_SETTINGS, "config")
    rpp = merge_settings(base, {"advantage_estimator": "reinforce_plus_plus"}, TRAINING_SETTINGS, "config")
    with pytest.raises(InvalidArgument, match="header.overrides.kl_coef: KL is a reward penalty"):
        merge_settings(rpp, {"use_kl_loss": True, "kl_coef": 1.0}, STEP_SETTINGS, "header.overrides")


def test_a_step_cannot_change_the_runs_advantage_settings():
    # The coordinator computed the step's group part for the run's estimator: a header that
    # switched the trainer's token part would mix two estimators in one step.
    base = TrainerConfig(hf_checkpoint="m")
    for setting, value in (
        ("advantage_estimator", "reinforce_plus_plus"),
        ("normalize_advantages", True),
        ("rollout_max_response_len", 7),
    ):
        assert setting in TRAINING_SETTINGS
        with pytest.raises(InvalidArgument, match=f"header.overrides.{setting}: cannot be changed here"):
            merge_settings(base, {setting: value}, STEP_SETTINGS, "header.overrides")
        assert merge_settings(base, {setting: getattr(base, setting)}, STEP_SETTINGS, "h") == base


def test_ref_load_must_be_a_model_with_the_policys_vocabulary(tiny_model_dir, tmp_path):
    from rollway.demo.tiny_model import make_tiny_model
    from rollway.trainer.model_loading import ModelLoadError
    from rollway.trainer.reference import check_reference

    policy = str(tiny_model_dir)
    check_reference(TrainerConfig(hf_checkpoint=policy, ref_load=policy))
    with pytest.raises(ModelLoadError, match=r"^ref_load: no config.json in"):
        check_reference(TrainerConfig(hf_checkpoint=policy, ref_load=str(tmp_path)))
    other = make_tiny_model(tmp_path / "other", vocab_size=1000)
    with pytest.raises(ModelLoadError, match="ref_load: vocabulary of 1000 tokens"):
        check_reference(TrainerConfig(hf_checkpoint=policy, ref_load=str(other)))
