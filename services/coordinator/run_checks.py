"""Cross-setting checks of a run config: rules no one setting's declaration can state.

Each returns the problems it finds as (setting, problem) pairs, [] for none, so that
parse_run_config (run_config.py) reports them all at once. The first few read the run's settings
as given (the values are known to coerce); the rest read the RunConfig built from them.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rollway.common.config import ConfigError, coerce_setting
from rollway.common.shared_settings import REWARD_NAMES
from rollway.coordinator.config import CoordinatorConfig
from rollway.rollout.config import PROCESS_SETTINGS, process_setting_problem
from rollway.trainer.config import TrainerConfig

if TYPE_CHECKING:
    from rollway.coordinator.run_config import RunConfig


def process_setting_problems(given: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Settings of a rollout process (its Generate queue) are no run's to set: refused, naming the
    service flag, instead of being pushed to a service that would ignore them."""
    return [(key, process_setting_problem(key)) for key in sorted(PROCESS_SETTINGS & set(given))]


def environment_problems(given: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Where the 'remote' environment comes from: environment_url (a service the user runs) or
    remote_environment (one the coordinator starts), exactly one. The values are known to coerce."""
    environment = given.get("environment", "none")
    if environment == "agent" and given.get("partial_rollout"):
        # An aborted agent episode cannot be continued: the agent's own state is gone with it.
        return [
            (
                "partial_rollout",
                "agent episodes (environment: agent) cannot be continued after an abort: "
                "run agents without partial_rollout",
            )
        ]
    if given.get("openenv_app") or environment == "openenv":
        return _openenv_problems(given, environment)
    if given.get("remote_environment"):
        if environment != "remote":
            return [
                (
                    "remote_environment",
                    f"serves the 'remote' environment, but the run's environment is {environment!r}: "
                    "set environment: remote",
                )
            ]
        if given.get("environment_url"):
            return [
                (
                    "environment_url",
                    "give either environment_url (an environment service you run) or "
                    "remote_environment (one the coordinator starts), not both",
                )
            ]
    elif environment == "remote" and not given.get("environment_url") and not given.get("rollout_addr"):
        return [
            (
                "environment_url",
                "the 'remote' environment needs environment_url (host:port of a running Environment "
                "service) or remote_environment (calculator or module:attr: the coordinator starts one)",
            )
        ]
    return []


def _openenv_problems(given: Mapping[str, Any], environment: str) -> list[tuple[str, str]]:
    """Where the 'openenv' environment comes from: openenv_url (a server the user runs) or
    openenv_app (one the coordinator serves), exactly one."""
    if given.get("openenv_app"):
        if environment != "openenv":
            return [
                (
                    "openenv_app",
                    f"serves the 'openenv' environment, but the run's environment is {environment!r}: "
                    "set environment: openenv",
                )
            ]
        if given.get("openenv_url"):
            return [("openenv_url", "give either openenv_url (a server you run) or openenv_app, not both")]
    elif not given.get("openenv_url") and not given.get("rollout_addr"):
        return [
            (
                "openenv_url",
                "the 'openenv' environment needs openenv_url (http://host:port of a running OpenEnv "
                "server) or openenv_app (module:attr of an OpenEnv app: the coordinator serves it)",
            )
        ]
    return []


def batch_arithmetic(given: dict[str, Any]) -> list[tuple[str, str]]:
    """num_steps_per_rollout, when the run gives it, is honoured (Miles: global_batch_size =
    samples per rollout / num_steps_per_rollout) or a contradiction is refused; it is never
    replaced by the arithmetic of the other settings. Writes the derived global_batch_size into
    `given`. The values are already known to coerce."""
    trainer_settings = given.get("trainer_settings") or {}
    if "num_steps_per_rollout" not in given and "num_steps_per_rollout" not in trainer_settings:
        return []
    steps = coerce_setting(
        TrainerConfig,
        "num_steps_per_rollout",
        given.get("num_steps_per_rollout", trainer_settings.get("num_steps_per_rollout")),
    )
    if steps <= 0:
        return [("num_steps_per_rollout", f"must be positive (got {steps})")]

    def value(name: str):
        if name in given:
            return coerce_setting(CoordinatorConfig, name, given[name])
        return next(f.default for f in dataclasses.fields(CoordinatorConfig) if f.name == name)

    sft = value("loss_type") == "sft_loss"
    samples = value("rollout_batch_size") * (1 if sft else value("n_samples_per_prompt"))
    arithmetic = "rollout_batch_size" + ("" if sft else " * n_samples_per_prompt") + f" = {samples}"
    if "global_batch_size" in given:
        batch = value("global_batch_size")
        if batch * steps != samples:
            return [
                (
                    "num_steps_per_rollout",
                    f"{steps} contradicts global_batch_size {batch}: {arithmetic} samples per rollout "
                    f"make {samples / batch:g} optimizer steps of {batch}; give only one of the two, "
                    f"or values whose product is {samples}",
                )
            ]
        return []
    if samples % steps:
        return [("num_steps_per_rollout", f"{steps} does not divide {arithmetic} samples per rollout")]
    given["global_batch_size"] = samples // steps
    return []


def missing_for_started_services(run: RunConfig) -> list[tuple[str, str]]:
    """Services the coordinator starts get everything from the run: what they require must be there."""
    problems = []
    addresses = run.addresses()
    for name in run.services_used():
        if addresses[name]:
            continue  # an attached service may have its own flags
        try:
            run.component(name).check_required()
        except ConfigError as exc:
            problems.append((exc.setting, f"{exc.problem} (the {name} the run starts has no other source)"))
    return unique_problems(problems)


def unused_environment_problems(run: RunConfig) -> list[tuple[str, str]]:
    """An environment the coordinator would start (remote_environment, openenv_app) needs a
    rollout service to use it."""
    c = run.coordinator
    if (c.remote_environment or c.openenv_app) and not run.managed_environment:
        return [
            (
                "openenv_app" if c.openenv_app else "remote_environment",
                "the run uses no rollout service (sft or debug_train_only): no environment",
            )
        ]
    return []


def reward_problems(run: RunConfig) -> list[tuple[str, str]]:
    """rm_type names a reward function the rollout service can have."""
    c = run.coordinator
    if "rollout" not in run.services_used() or run.rollout.environment != "none":
        return []  # no generation, or episodes rewarded by their environment
    if c.rm_type and c.rm_type not in REWARD_NAMES:
        close = difflib.get_close_matches(c.rm_type, REWARD_NAMES, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return [
            ("rm_type", f"unknown reward function {c.rm_type!r} (known: {', '.join(REWARD_NAMES)}){hint}")
        ]
    # Where the 'remote' and 'custom' rewards come from: refused here, not at the first Generate,
    # for rollout services the run starts (an attached one may have them from its own flags).
    if any(run.addresses().get("rollout", [])):
        return []
    if c.rm_type == "remote" and not run.rollout.rm_url:
        return [("rm_url", "rm_type remote needs rm_url: the URL of the reward server (docs/rewards.md)")]
    if c.rm_type == "custom" and not run.rollout.custom_rm_path:
        return [("custom_rm_path", "rm_type custom needs custom_rm_path: module:function (docs/rewards.md)")]
    return []  # an unlabelled prompt's samples get reward 0 and a reward_error (docs/rewards.md)


def unique_problems(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The first problem of each setting, in order."""
    seen, out = set(), []
    for setting, problem in problems:
        if setting not in seen:
            seen.add(setting)
            out.append((setting, problem))
    return out
