"""One run config, one schema: the flat mapping of `rollway run`'s YAML is what StartRun takes.

Every component (coordinator, dataloader, rollout, trainer) declares its settings as a dataclass;
a run config is one flat namespace of all their keys (Miles' flags). Parsing reports every
error at once, each naming its setting. What a run pushes to a service at its Init is the part
of the run config that service declares, as given (a setting the run leaves out keeps the
service's start-up flag, so a service started with flags keeps them and a bare one gets the
defaults).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollway.common.config import ConfigError, coerce_setting, from_dict
from rollway.common.run_components import run_components
from rollway.common.shared_settings import REWARD_NAMES
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.plan.steps import (
    DataShape,
    check_data,
    end_of_data_problems,
    end_of_data_text,
    num_steps,
)
from rollway.dataloader.config import DataloaderConfig
from rollway.rollout.config import PROCESS_SETTINGS, RolloutConfig, process_setting_problem
from rollway.trainer.config import TrainerConfig

# Config modules import no torch, so parsing a run config is instant.
COMPONENTS: dict[str, type] = run_components()
SERVICES = ("dataloader", "rollout", "trainer")
# The environment_url of a run whose environment service the coordinator starts, until it has.
STARTED_BY_COORDINATOR = "(started by the coordinator: remote_environment)"
OPENENV_SERVER_MODULE = "rollway.openenv_host"
# Where config.json gives a model's context length (transformers' names across architectures).
CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


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
    problems += _process_setting_problems(given)
    problems += _batch_arithmetic(given)
    problems += _environment_problems(given)
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
    problems += _missing_for_started_services(run)
    if (run.coordinator.remote_environment or run.coordinator.openenv_app) and not run.managed_environment:
        problems.append(
            (
                "openenv_app" if run.coordinator.openenv_app else "remote_environment",
                "the run uses no rollout service (sft or debug_train_only): no environment",
            )
        )
    problems += _model_problems(run, {setting for setting, _ in problems})
    problems += _reward_problems(run)
    preconditions = _plan_steps(run, problems, check_files)
    if problems:
        raise RunConfigError(_unique(problems), preconditions)
    return run


def _plan_steps(run: RunConfig, problems: list[tuple[str, str]], check_files: bool) -> set[str]:
    """Check the training data (files, columns) and settle the run's number of steps up front
    (plan/steps.py: num_rollout wins and the data loops; num_rollout 0 runs num_epoch epochs).
    Appends to `problems`; returns the settings whose problems are preconditions (a missing file)."""
    c, d = run.coordinator, run.dataloader
    uses_data = "dataloader" in run.services_used()
    # Only a dataloader the coordinator starts here reads the files here (Ray: on the cluster's nodes).
    started = uses_data and not run.addresses()["dataloader"] and c.launcher == "local"
    shape = check_data(d)
    if not started:  # an attached dataloader reads its files where it runs, with its own keys
        shape = DataShape(shape.num_rows, [])
    elif not check_files:  # a config written for another machine: only the files here are checked
        shape = DataShape(shape.num_rows, [p for p in shape.problems if not p[2]])
    found = shape.problems if uses_data else []
    if uses_data and (check_files or shape.num_rows is not None or d.num_epoch <= 0):
        found += end_of_data_problems(c.num_rollout, d.num_epoch, c.rollout_batch_size, shape)
    problems += [(setting, problem) for setting, problem, _ in found]
    run.num_rows = shape.num_rows
    if uses_data and not found:
        # Worded before num_rollout is settled: a num_epoch run reads "num_epoch E x R rows / ...".
        run.end_of_data = end_of_data_text(c.num_rollout, d.num_epoch, c.rollout_batch_size, shape.num_rows)
        c.num_rollout = num_steps(c.num_rollout, d.num_epoch, c.rollout_batch_size, shape.num_rows)
    return {setting for setting, _, precondition in found if precondition}


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


def _reward_problems(run: RunConfig) -> list[tuple[str, str]]:
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


def _process_setting_problems(given: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Settings of a rollout process (its Generate queue) are no run's to set: refused, naming the
    service flag, instead of being pushed to a service that would ignore them."""
    return [(key, process_setting_problem(key)) for key in sorted(PROCESS_SETTINGS & set(given))]


def _environment_problems(given: Mapping[str, Any]) -> list[tuple[str, str]]:
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


def _batch_arithmetic(given: dict[str, Any]) -> list[tuple[str, str]]:
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


def _missing_for_started_services(run: RunConfig) -> list[tuple[str, str]]:
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
    return _unique(problems)


def _model_problems(run: RunConfig, reported: set[str]) -> list[tuple[str, str]]:
    """The model the started services would load, read from its config.json (no torch): a
    directory that is no model, or a context too short for any prompt plus a full response.

    Only for services the coordinator starts: an attached service reads its model where it runs
    (maybe another machine) and validates its own settings."""
    addresses = run.addresses()
    started = [name for name in run.services_used() if not addresses[name]]
    path = str(run.given.get("hf_checkpoint") or "")
    if not started or not path or "hf_checkpoint" in reported:
        return []
    config_json = Path(path) / "config.json"
    if not Path(path).is_dir():
        problem = "is not a directory" if Path(path).exists() else "does not exist"
        return [("hf_checkpoint", f"{path} {problem} (the run starts {', '.join(started)}, which load it)")]
    try:
        model_config = json.loads(config_json.read_text())
    except FileNotFoundError:
        return [("hf_checkpoint", f"{path} is not a Hugging Face model directory (no config.json)")]
    except (OSError, ValueError) as exc:
        return [("hf_checkpoint", f"{config_json} cannot be read as JSON: {exc}")]
    if not isinstance(model_config, dict):
        return [("hf_checkpoint", f"{config_json} is not a model config (a JSON object)")]
    if "rollout" not in started or "loss_type" in reported:
        # Only the rollout service generates: nothing else needs room for a response. A refused
        # loss_type leaves the run's mode unknown (SFT starts no rollout): no knock-on rule (#38).
        return []
    return _context_problems(run, model_config, config_json)


def _context_problems(run: RunConfig, model_config: dict, config_json: Path) -> list[tuple[str, str]]:
    """Every prompt has at least one token: a response of rollout_max_response_len must leave room."""
    response_len = run.coordinator.rollout_max_response_len
    prompt_len = run.dataloader.rollout_max_prompt_len
    if run.rollout.rollout_max_context_len:
        context_len = run.rollout.rollout_max_context_len
        source = f"rollout_max_context_len {context_len}"
    else:
        text_config = model_config.get("text_config") or {}
        found = [
            (k, c[k])
            for c in (model_config, text_config)
            for k in CONTEXT_LENGTH_KEYS
            if isinstance(c.get(k), int)
        ]
        if not found:
            return []  # the model does not say; the rollout service checks each request
        key, context_len = found[0]
        source = f"the model's context of {context_len} tokens ({key} in {config_json})"
    if response_len >= context_len:
        return [
            (
                "rollout_max_response_len",
                f"{response_len} leaves no room for a prompt in {source}: "
                f"every prompt would be refused; lower it below {context_len}",
            )
        ]
    if prompt_len and prompt_len + response_len > context_len:
        return [
            (
                "rollout_max_response_len",
                f"{response_len} plus rollout_max_prompt_len {prompt_len} exceeds {source}: prompts "
                f"of up to {prompt_len} tokens are admitted but would be refused; lower either so "
                f"that their sum is at most {context_len}",
            )
        ]
    return []


def _unique(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen, out = set(), []
    for setting, problem in problems:
        if setting not in seen:
            seen.add(setting)
            out.append((setting, problem))
    return out


def jsonable(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A settings mapping as plain JSON data (tuples to lists), for a google.protobuf.Struct."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in mapping.items()}
