"""A run's 'remote' environment comes from environment_url (a service the user runs) or from
remote_environment (one the coordinator starts and supervises): what it starts, with which flags,
and each contradiction refused naming its setting."""

from __future__ import annotations

import pytest
from support.run_configs import problems

from rollway.coordinator.run_config import STARTED_BY_COORDINATOR, parse_run_config


def grpo(model, **extra) -> dict:
    return {
        "hf_checkpoint": str(model),
        "prompt_data": ["/data/rl.parquet"],
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "rollout_max_response_len": 8,
        **extra,
    }


def test_a_managed_calculator_is_started_with_the_runs_tool_call_format(model_dir):
    run = parse_run_config(
        grpo(
            model_dir,
            environment="remote",
            remote_environment="calculator",
            generate_tool_call_parser="qwen25",
        )
    )
    assert run.managed_environment
    assert run.addresses() == {"dataloader": [], "rollout": [], "trainer": [], "environment": []}
    assert run.environment_args() == ["--environment", "calculator", "--generate-tool-call-parser", "qwen25"]
    # Until the service is up, the rollout services are told nothing about it.
    assert run.rollout.environment_url == STARTED_BY_COORDINATOR
    assert "environment_url" not in run.service_settings("rollout")
    run.use_environment("127.0.0.1:4321")
    assert run.service_settings("rollout")["environment_url"] == "127.0.0.1:4321"
    assert run.service_settings("rollout")["environment"] == "remote"


def test_a_managed_custom_environment_is_served_by_its_class_path(model_dir):
    run = parse_run_config(
        grpo(model_dir, environment="remote", remote_environment="my_env:GuessEnvironment")
    )
    assert run.environment_args() == [
        "--environment", "custom",
        "--custom-generate-function-path", "my_env:GuessEnvironment",
        "--generate-tool-call-parser", "qwen3",
    ]  # fmt: skip


def test_a_run_with_its_own_environment_url_starts_no_environment(model_dir):
    run = parse_run_config(grpo(model_dir, environment="remote", environment_url="127.0.0.1:50070"))
    assert not run.managed_environment and "environment" not in run.addresses()
    assert run.service_settings("rollout")["environment_url"] == "127.0.0.1:50070"


@pytest.mark.parametrize(
    ("extra", "setting", "named"),
    [
        ({"environment": "remote"}, "environment_url", "or remote_environment (calculator or module:attr"),
        ({"remote_environment": "calculator"}, "remote_environment", "the run's environment is 'none'"),
        (
            {"environment": "calculator", "remote_environment": "calculator"},
            "remote_environment",
            "set environment: remote",
        ),
        (
            {"environment": "remote", "remote_environment": "calculator", "environment_url": "127.0.0.1:1"},
            "environment_url",
            "not both",
        ),
        (
            {"environment": "remote", "remote_environment": "my_env"},
            "remote_environment",
            "must be calculator or module:attr of an Environment (got 'my_env')",
        ),
        (
            {"environment": "remote", "remote_environment": "calculator", "launcher": "ray"},
            "remote_environment",
            "not with launcher ray",
        ),
        (
            {"environment": "remote", "remote_environment": "calculator", "debug_train_only": True},
            "remote_environment",
            "the run uses no rollout service",
        ),
        (
            {"environment": "agent", "agent_function_path": "my_agent:run", "partial_rollout": True},
            "partial_rollout",
            "agent episodes (environment: agent) cannot be continued after an abort",
        ),
        ({"environment": "agent"}, "agent_function_path", "the 'agent' environment needs module:attr"),
        (
            {"environment": "agent", "agent_function_path": "my_agent"},
            "agent_function_path",
            "must be module:attr (got 'my_agent')",
        ),
    ],
)
def test_contradictory_environment_settings_are_refused_naming_them(model_dir, extra, setting, named):
    found = problems(grpo(model_dir, **extra))
    assert setting in found and named in found[setting], found


def test_a_managed_openenv_app_is_served_by_the_openenv_server(model_dir):
    run = parse_run_config(grpo(model_dir, environment="openenv", openenv_app="my_env.server:app"))
    assert run.managed_environment
    assert run.addresses()["environment"] == []
    assert run.environment_module == "rollway.openenv_host"
    assert run.environment_args() == ["--openenv-app", "my_env.server:app"]
    assert run.rollout.openenv_url == STARTED_BY_COORDINATOR
    assert "openenv_url" not in run.service_settings("rollout")
    run.use_environment("127.0.0.1:4321")
    assert run.service_settings("rollout")["openenv_url"] == "http://127.0.0.1:4321"
    assert "environment_url" not in run.service_settings("rollout")


@pytest.mark.parametrize(
    ("extra", "setting", "named"),
    [
        ({"environment": "openenv"}, "openenv_url", "or openenv_app (module:attr of an OpenEnv app"),
        ({"openenv_app": "m:app"}, "openenv_app", "set environment: openenv"),
        (
            {"environment": "openenv", "openenv_app": "m:app", "openenv_url": "http://h:1"},
            "openenv_url",
            "not both",
        ),
        ({"environment": "openenv", "openenv_app": "m"}, "openenv_app", "must be module:attr"),
        (
            {"environment": "openenv", "openenv_app": "m:app", "launcher": "ray"},
            "openenv_app",
            "launcher ray",
        ),
        (
            {"environment": "openenv", "openenv_url": "http://h:1", "openenv_turns": "m"},
            "openenv_turns",
            "must be module:attr",
        ),
    ],
)
def test_contradictory_openenv_settings_are_refused_naming_them(model_dir, extra, setting, named):
    found = problems(grpo(model_dir, **extra))
    assert setting in found and named in found[setting], found
