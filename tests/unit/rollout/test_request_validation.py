"""GenerateRequest -> SampleRequests: defaults, per-sample seeds, context limits."""

import pytest

from rollway.common.errors import InvalidArgument, ResourceExhausted
from rollway.common.v1 import common_pb2
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import ModelInfo
from rollway.rollout.request_validation import plan_generation
from rollway.rollout.rewards.types import RewardFunction
from rollway.rollout.v1 import rollout_pb2

INFO = ModelInfo(model="m", vocab_size=100, max_context_len=64, eos_token_ids=frozenset({2}), dtype="float32")
CONFIG = RolloutConfig(
    hf_checkpoint="m",
    n_samples_per_prompt=2,
    rollout_temperature=0.8,
    rollout_top_p=0.95,
    rollout_top_k=20,
    rollout_max_response_len=50,
    rollout_stop=["\n\n"],
    rollout_stop_token_ids=[7],
    sampling_seed=1000,
)
REWARDS = {
    "exact_match": RewardFunction("exact_match", lambda sample: 0.0),
    "group_rm": RewardFunction("group_rm", lambda samples: [0.0] * len(samples), group=True),
}


def _plan(prompts, **kw):
    request = rollout_pb2.GenerateRequest(prompts=[rollout_pb2.Prompt(token_ids=p) for p in prompts], **kw)
    return plan_generation(request, CONFIG, INFO, REWARDS)


def test_service_defaults_apply_without_sampling_params():
    plan = _plan([[1, 2, 3], [4] * 30])
    assert plan.n_samples_per_prompt == 2 and plan.reward == "exact_match" and plan.group_indices == [0, 1]
    first, last = plan.samples[0].params, plan.samples[-1].params
    assert (first.temperature, first.top_p, first.top_k, first.stop, first.stop_token_ids) == (
        0.8,
        0.95,
        20,
        ("\n\n",),
        frozenset({7}),
    )
    assert first.max_new_tokens == 50 and last.max_new_tokens == 64 - 30  # the default is cut to fit
    assert [s.params.seed for s in plan.samples] == [1000, 1001, 1002, 1003]
    assert [s.prompt_key for s in plan.samples] == [0, 0, 1, 1]


def test_request_sampling_params_override_and_zero_means_default():
    sp = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=10, stop=["x"], stop_token_ids=[9], seed=5)
    plan = _plan([[1, 2]], n_samples_per_prompt=3, sampling_params=sp, reward="none")
    params = plan.samples[2].params
    assert params.greedy and params.top_p == 0.95 and params.top_k == 20 and params.max_new_tokens == 10
    assert params.stop == ("\n\n", "x") and params.stop_token_ids == frozenset({7, 9})
    assert [s.params.seed for s in plan.samples] == [5, 6, 7] and plan.reward == "none"


def test_limits():
    with pytest.raises(
        InvalidArgument, match=r"prompts\[0\].token_ids: prompt of 60 tokens \+ max_new_tokens 10"
    ):
        _plan([[1] * 60], sampling_params=common_pb2.SamplingParams(temperature=1, max_new_tokens=10))
    with pytest.raises(InvalidArgument, match="fills the model context"):
        _plan([[1] * 64])
    with pytest.raises(ResourceExhausted, match="4096"):
        _plan([[1]], n_samples_per_prompt=4097)


def test_a_response_prefix_extends_the_engine_prompt_and_counts_against_max_new_tokens():
    prefix = rollout_pb2.ResponsePrefix(token_ids=[5, 6, 8], log_probs=[-0.1, -0.2, -0.3])
    request = rollout_pb2.GenerateRequest(
        prompts=[
            rollout_pb2.Prompt(token_ids=[1, 2], response_prefix=prefix),
            rollout_pb2.Prompt(token_ids=[1]),
        ],
        n_samples_per_prompt=1,
        sampling_params=common_pb2.SamplingParams(max_new_tokens=10),
    )
    plan = plan_generation(request, CONFIG, INFO, REWARDS)
    assert [s.prompt_token_ids for s in plan.samples] == [(1, 2, 5, 6, 8), (1,)]
    assert [s.params.max_new_tokens for s in plan.samples] == [7, 10]
    request.reward = "group_rm"
    with pytest.raises(InvalidArgument, match=r"prompts\[0\].response_prefix: a group reward"):
        plan_generation(request, CONFIG, INFO, REWARDS)


def _episode_plan(prompt: rollout_pb2.Prompt, environment="calculator"):
    from rollway.rollout.environments.registry import EnvironmentRegistry

    request = rollout_pb2.GenerateRequest(prompts=[prompt], n_samples_per_prompt=1, environment=environment)
    return plan_generation(request, CONFIG, INFO, REWARDS, environments=EnvironmentRegistry(CONFIG).get)


def test_an_episode_keeps_its_prefix_and_per_turn_budget():
    prefix = rollout_pb2.ResponsePrefix(
        token_ids=[5, 6, 7, 8],
        log_probs=[-0.5, -0.25, 0.0, 0.0],
        loss_mask=[1, 1, 0, 0],
        turns=[
            common_pb2.Turn(role="model", num_tokens=2, weight_version=3),
            common_pb2.Turn(role="environment", num_tokens=2),
        ],
    )
    plan = _episode_plan(rollout_pb2.Prompt(token_ids=[1, 2, 3], label="7", response_prefix=prefix))
    [sample] = plan.samples
    assert plan.environment == "calculator" and plan.reward == "none"  # the environment rewards
    assert sample.prompt_token_ids == (1, 2, 3) and sample.params.max_new_tokens == 50  # per turn
    spec = sample.episode
    assert (
        spec.label == "7" and spec.prefix_token_ids == (5, 6, 7, 8) and spec.prefix_loss_mask == (1, 1, 0, 0)
    )
    assert [(t.role, t.num_tokens, t.weight_version) for t in spec.prefix_turns] == [
        ("model", 2, 3),
        ("environment", 2, 0),
    ]
    assert _plan([[1, 2]]).samples[0].episode is None  # --environment none: single turn


@pytest.mark.parametrize(
    ("prefix", "field"),
    [
        (dict(token_ids=[5, 6], log_probs=[0.0]), "response_prefix.log_probs"),
        (dict(token_ids=[5, 6], log_probs=[0.0, 0.0], loss_mask=[1]), "response_prefix.loss_mask"),
        (dict(token_ids=[5, 6], log_probs=[0.0, 0.0], loss_mask=[1, 2]), "response_prefix.loss_mask"),
        (
            dict(token_ids=[5, 6], log_probs=[0.0, 0.0], turns=[common_pb2.Turn(role="model", num_tokens=3)]),
            "response_prefix.turns",
        ),
        (
            dict(token_ids=[5, 6], log_probs=[0.0, 0.0], turns=[common_pb2.Turn(role="user", num_tokens=2)]),
            "response_prefix.turns[0]",
        ),
    ],
)
def test_a_bad_episode_prefix_is_invalid_argument_naming_the_field(prefix, field):
    with pytest.raises(InvalidArgument, match=field.replace("[", r"\[").replace("]", r"\]")):
        _episode_plan(
            rollout_pb2.Prompt(token_ids=[1, 2, 3], response_prefix=rollout_pb2.ResponsePrefix(**prefix))
        )


def test_an_unknown_or_unusable_environment_is_invalid_argument():
    with pytest.raises(InvalidArgument, match="unknown environment 'chess'"):
        _episode_plan(rollout_pb2.Prompt(token_ids=[1]), environment="chess")
    with pytest.raises(InvalidArgument, match="environment_url"):
        _episode_plan(rollout_pb2.Prompt(token_ids=[1]), environment="remote")


@pytest.mark.parametrize(
    ("settings", "setting"),
    [
        ({"environment": "remote"}, "environment_url"),
        ({"environment": "custom"}, "custom_generate_function_path"),
        ({"custom_generate_function_path": "no_colon"}, "custom_generate_function_path"),
        ({"environment": "verifiers"}, "verifiers_taskset"),
        ({"verifiers_taskset": "no_colon"}, "verifiers_taskset"),
        ({"generate_max_turns": 0}, "generate_max_turns"),
        ({"generate_turn_timeout": 0}, "generate_turn_timeout"),
        ({"generate_max_total_tokens": -1}, "generate_max_total_tokens"),
    ],
)
def test_bad_episode_settings_name_the_setting(settings, setting):
    from rollway.common.config import ConfigError, from_dict

    with pytest.raises(ConfigError) as err:  # a value's own limits at loading, rules across settings after
        from_dict(RolloutConfig, {"hf_checkpoint": "m", **settings}).validate()
    assert err.value.setting == setting
