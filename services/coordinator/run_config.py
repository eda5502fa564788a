"""One run config, one schema: the flat mapping of `rollway run`'s YAML is what StartRun takes.

Every component (coordinator, dataloader, rollout, trainer) declares its settings as a dataclass;
a run config is one flat namespace of all their keys (Miles' flags). Parsing reports every
error at once, each naming its setting. What a run pushes to a service at its Init is the part
of the run config that service declares, as given (a setting the run leaves out keeps the
service's start-up flag, so a service started with flags keeps them and a bare one gets the
defaults).

Here: the RunConfig a run is given as, and parse_run_config, which checks each value and builds
one. The rules across settings are in run_checks.py; the model and data it reads in run_inputs.py.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollway.common.config import ConfigError, coerce_setting, from_dict
from rollway.common.run_components import run_components
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.run_checks import (
    batch_arithmetic,
    environment_problems,
    missing_for_started_services,
    process_setting_problems,
    reward_problems,
    unique_problems,
    unused_environment_problems,
)
from rollway.coordinator.run_inputs import model_problems, plan_steps
from rollway.dataloader.config import DataloaderConfig
from rollway.rollout.config import RolloutConfig
from rollway.trainer.config import TrainerConfig

# Config modules import no torch, so parsing a run config is instant.
COMPONENTS: dict[str, type] = run_components()
SERVICES = ("dataloader", "rollout", "trainer")
# The environment_url of a run whose environment service the coordinator starts, until it has.
STARTED_BY_COORDINATOR = "(started by the coordinator: remote_environment)"
OPENENV_SERVER_MODULE = "rollway.openenv_host"


class RunConfigError(ConfigError):
    """Every problem of a run config, each as (setting, problem); `preconditions` names the
    settings whose problem is the world's, not the value's (a data file missing)."""

    def __init__(self, problems: list[tuple[str, str]], preconditions: set[str] = frozenset()):
        self.problems = problems
        self.preconditions = set(preconditions)
        super().__init__(problems[0][0], "; ".join(f"{s}: {p}" for s, p in problems[1:]) or problems[0][1])
        self.args = ("; ".join(f"{setting}: {problem}" for setting, problem in problems),)

    def __str__(self) -> str:
        return self.args[0]


@dataclass
class RunConfig:
    """A parsed run: each component's settings, and the keys the run gave (pushed to services)."""

    coordinator: CoordinatorConfig
    dataloader: DataloaderConfig
    rollout: RolloutConfig
    trainer: TrainerConfig
    given: dict[str, Any]
    # How the number of steps (coordinator.num_rollout, resolved) was settled (plan/steps.py).
    end_of_data: str = "num_rollout: the data loops over epochs until then"
    num_rows: int | None = None  # rows of the training data, where the coordinator can read it

    def component(self, name: str):
        return getattr(self, name)

    def service_settings(self, name: str) -> dict[str, Any]:
        """The settings a run pushes to service `name` at its Init: the given keys it declares."""
        fields = _field_names(COMPONENTS[name])
        settings = {k: v for k, v in self.given.items() if k in fields}
        if name == "dataloader":  # the run's step count ends it, never the data (plan/steps.py)
            settings["num_epoch"] = 0
        if name == "trainer":  # the trainer's share of the coordinator's batch arithmetic
            c = self.coordinator
            settings.update(c.trainer_settings)
            # Equal to a given num_steps_per_rollout (parse_run_config refuses a contradiction).
            settings["num_steps_per_rollout"] = c.samples_per_rollout // c.global_batch_size
        return settings

    def services_used(self) -> list[str]:
        """The services the run calls (debug modes leave some out)."""
        c = self.coordinator
        used = []
        if not c.load_debug_rollout_data:
            used.append("dataloader")
        if not c.train_only:
            used.append("rollout")
        if not c.debug_rollout_only:
            used.append("trainer")
        return used

    def addresses(self) -> dict[str, list[str]]:
        """Addresses the run config gives for its services (empty list: the coordinator starts it);
        "environment" when the coordinator starts the run's Environment service (remote_environment)."""
        c = self.coordinator
        given = {
            "dataloader": [c.dataloader_addr],
            "rollout": list(c.rollout_addr),
            "trainer": [c.trainer_addr],
        }
        addresses = {name: [a for a in given[name] if a] for name in self.services_used()}
        if self.managed_environment:
            addresses["environment"] = []
        return addresses

    @property
    def managed_environment(self) -> bool:
        """The coordinator starts, watches and restarts the run's Environment service (or the
        OpenEnv server of openenv_app)."""
        c = self.coordinator
        return bool(c.remote_environment or c.openenv_app) and "rollout" in self.services_used()

    @property
    def environment_module(self) -> str | None:
        """The module of the managed environment's process, where not the Environment service:
        an OpenEnv server speaks HTTP (health: GET /health), not gRPC."""
        return OPENENV_SERVER_MODULE if self.coordinator.openenv_app else None

    def environment_args(self) -> list[str]:
        """Flags of `python -m rollway.environment` serving remote_environment (or of
        the OpenEnv server serving openenv_app)."""
        if self.coordinator.openenv_app:
            return ["--openenv-app", self.coordinator.openenv_app]
        served = self.coordinator.remote_environment
        args = ["--generate-tool-call-parser", self.rollout.generate_tool_call_parser]
        if served == "calculator":
            return ["--environment", "calculator", *args]
        return ["--environment", "custom", "--custom-generate-function-path", served, *args]

    def use_environment(self, address: str) -> None:
        """The address of the Environment service the coordinator started: the rollout services
        get it as environment_url (openenv_url) at their (next) Init."""
        if self.coordinator.openenv_app:
            self.given["openenv_url"] = self.rollout.openenv_url = f"http://{address}"
            return
        self.given["environment_url"] = address
        self.rollout.environment_url = address


def _field_names(cls: type) -> set[str]:
    names = set()
    for f in dataclasses.fields(cls):
        names.add(f.name)
        names.update(a.replace("-", "_") for a in f.metadata.get("aliases", ()))
    return names


def _canonical(cls: type, key: str) -> str:
    for f in dataclasses.fields(cls):
        if key == f.name or key in (a.replace("-", "_") for a in f.metadata.get("aliases", ())):
            return f.name
    return key


def _validated(cls: type, part: dict) -> tuple[Any, list[tuple[str, str]]]:
    """The component built from `part`, and every problem its validation finds, not only the
    first: a setting found wrong is put back to its default and the rest validated again."""
    problems: list[tuple[str, str]] = []
    remaining = dict(part)
    while True:
        try:
            built = from_dict(cls, remaining, require=False)
            return (built if not problems else None), problems
        except ConfigError as exc:
            problems.append((exc.setting, exc.problem))
            if exc.setting not in remaining:  # not a given value (a default's combination): stop here
                return None, problems
            del remaining[exc.setting]


def parse_run_config(
    mapping: Mapping[str, Any], *, check_files: bool = False, strict: bool = False
) -> RunConfig:
    """Parse a flat run config; RunConfigError lists every problem, each naming its setting.

    Nothing hides anything else: a key that is unknown or has a wrong value is reported and left
    out, and the rest is still built and validated (cross-setting checks, the model, the data).
    With `check_files` (StartRun, ValidateRun) a data file the run's own dataloader would read
    must exist here; without it only the files that exist are checked (a config written for
    another machine still parses). `strict` (the gRPC API) refuses a value of the wrong JSON type
    ("1e-3" for a number) instead of converting it."""
    given = {str(k).replace("-", "_"): v for k, v in mapping.items()}
    known = set().union(*(_field_names(cls) for cls in COMPONENTS.values()))
    problems: list[tuple[str, str]] = []
    rejected: set[str] = set()  # keys left out of the configs built below
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            problems.append((key, "unknown setting" + (f"; did you mean {close[0]}?" if close else "")))
            rejected.add(key)
    # Each value on its own first, so that every wrong value is reported, not only the first.
    for key, value in given.items():
        for cls in COMPONENTS.values():
            if key in _field_names(cls):
                try:
                    coerce_setting(cls, _canonical(cls, key), value, strict=strict)
                except ConfigError as exc:
                    problems.append((exc.setting, exc.problem))
                    rejected.add(key)
                    break
    trainer_settings_problems = _trainer_settings_problems(given.get("trainer_settings"))
    if trainer_settings_problems:
        problems += trainer_settings_problems
        rejected.add("trainer_settings")
    given = {k: v for k, v in given.items() if k not in rejected}
    problems += process_setting_problems(given)
    problems += batch_arithmetic(given)
    problems += environment_problems(given)
    configs = {}
    attached = _attached(given)
    for name, cls in COMPONENTS.items():
        part = {_canonical(cls, k): v for k, v in given.items() if k in _field_names(cls)}
        if name == "rollout" and given.get("remote_environment"):
            part["environment_url"] = STARTED_BY_COORDINATOR  # its address, once started
        if name == "rollout" and given.get("openenv_app"):
            part["openenv_url"] = STARTED_BY_COORDINATOR
        built, found = _validated(cls, part)
        # An attached service combines these with its own flags and validates the result itself
        # at Init (INVALID_ARGUMENT naming the setting); the values are checked above.
        configs[name] = built if built is not None else _unvalidated(cls, part)
        if name not in attached:
            problems += found
    run = RunConfig(**configs, given={_canonical_any(k): v for k, v in given.items()})
    problems += missing_for_started_services(run)
    problems += unused_environment_problems(run)
    problems += model_problems(run, {setting for setting, _ in problems})
    problems += reward_problems(run)
    preconditions = plan_steps(run, problems, check_files)
    if problems:
        raise RunConfigError(unique_problems(problems), preconditions)
    return run


def _trainer_settings_problems(trainer_settings: Any) -> list[tuple[str, str]]:
    """trainer_settings (sent with trainer.Init) holds trainer settings with valid values: checked
    here, as the schema describes it, not at the trainer's Init after the run has started."""
    if trainer_settings is None:
        return []
    if not isinstance(trainer_settings, Mapping):
        return [
            (
                "trainer_settings",
                f"must be a mapping of trainer settings (got {type(trainer_settings).__name__})",
            )
        ]
    fields = _field_names(TrainerConfig)
    problems = []
    for key, value in trainer_settings.items():
        if key not in fields:
            problems.append(("trainer_settings", f"{key}: not a trainer setting"))
            continue
        try:
            coerce_setting(TrainerConfig, _canonical(TrainerConfig, key), value, strict=True)
        except ConfigError as exc:
            problems.append(("trainer_settings", f"{key}: {exc.problem}"))
    return problems[:1]


def _canonical_any(key: str) -> str:
    for cls in COMPONENTS.values():
        name = _canonical(cls, key)
        if name != key:
            return name
    return key


def _attached(given: Mapping[str, Any]) -> set[str]:
    keys = {"dataloader": "dataloader_addr", "rollout": "rollout_addr", "trainer": "trainer_addr"}
    return {name for name, key in keys.items() if given.get(key)}


def _unvalidated(cls: type, part: Mapping[str, Any]):
    values = {}
    for f in dataclasses.fields(cls):
        values[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    values.update({k: coerce_setting(cls, k, v) for k, v in part.items()})
    return cls(**values)


def jsonable(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A settings mapping as plain JSON data (tuples to lists), for a google.protobuf.Struct."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in mapping.items()}
