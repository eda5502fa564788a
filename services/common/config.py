"""Typed configuration: dataclasses loaded from YAML and overridden by command-line flags.

A component declares one dataclass whose fields use `setting(default, "one-line doc")`. The
command-line flags are generated from the fields (`lr_warmup_iters` -> `--lr-warmup-iters`), so
they are never written twice. Values are checked once, here, at the edge: a wrong type, an
unknown key or a failed `validate()` raises ConfigError naming the setting.

This module must not import torch: entry points parse their configuration first, so `--help`
and configuration errors are instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import importlib
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

T = TypeVar("T")

# A `module:attr` path (a user's function or class), both parts non-empty; or nothing. Patterns are
# searched as JSON Schema does, and avoid `$` (Python's matches before a final newline, ECMA's not).
MODULE_ATTR_OR_EMPTY = r"^((?![\s\S])|[^:]+:[\s\S])"
CALCULATOR_OR_MODULE_ATTR = r"^((calculator)?(?![\s\S])|[^:]+:[\s\S])"
KEY_EQUALS_VALUE = r"^[^=]+="
# A run id names a directory under the runs root: no separators, no "..", no leading dot.
RUN_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
RUN_ID_OR_EMPTY = rf"^((?![\s\S])|{RUN_ID}(?![\s\S]))"
# What a value of each pattern looks like, for the error that refuses one.
PATTERN_WORDS = {
    MODULE_ATTR_OR_EMPTY: "module:attr",
    CALCULATOR_OR_MODULE_ATTR: "calculator or module:attr of an Environment",
    KEY_EQUALS_VALUE: "KEY=VALUE",
    RUN_ID_OR_EMPTY: "a run id: 1-128 letters, digits, '.', '_' or '-', not starting with '.' or '-'",
}

# Integer settings travel in protobuf fields (int32 counts, int64 steps in RunInfo): a value that
# does not fit would be accepted here and fail later, deep inside a run or a status call. Settings
# that may be larger (byte counts) declare their own `bounds`.
INT_BOUNDS = (-(2**31), 2**31 - 1)


class ConfigError(ValueError):
    """A configuration value is wrong. `setting` names it (as its flag name, without dashes)."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


def load_object(path: str, setting_name: str, *, callable_only: bool = False) -> Any:
    """What `module:attr` names (a user's environment, agent, reward or taskset), imported here;
    a ConfigError naming `setting_name` when the path is malformed, the module does not import
    (a syntax error inside it too), or it has no such attribute (or no such callable)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(setting_name, f"must be module:attr (got {path!r})")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a syntax error inside the module is as fatal as a missing one
        raise ConfigError(
            setting_name, f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    found = getattr(module, attr, None)
    if found is None or (callable_only and not callable(found)):
        what = "callable" if callable_only else "attribute"
        raise ConfigError(setting_name, f"module {module_name!r} has no {what} {attr!r}")
    return found


def setting(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    choices: Sequence[Any] | None = None,
    aliases: Sequence[str] = (),
    shared: bool = False,
    bounds: tuple[int, int] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    exclusive_maximum: float | None = None,
    pattern: str | None = None,
    min_length: int | None = None,
):
    """A dataclass field with a one-line doc (the flag's help), optional allowed values and aliases.

    Aliases are other names accepted as keys and flags, for names Python cannot use as a field
    (Miles' `--async` is the field `async_mode` with alias "async").

    The limits (minimum ... min_length, JSON Schema's keywords and meaning; `pattern` is searched,
    not anchored) apply to the value, or to each item of a list. They are declared once: the
    config loader refuses a value outside them and the run config's JSON Schema advertises them,
    so a client checking a config with the schema and the server cannot disagree.
    """
    limits = {
        "minimum": minimum,
        "maximum": maximum,
        "exclusiveMinimum": exclusive_minimum,
        "exclusiveMaximum": exclusive_maximum,
        "pattern": pattern,
        "minLength": min_length,
    }
    metadata = {
        "doc": doc,
        "choices": tuple(choices) if choices else None,
        "aliases": tuple(aliases),
        "shared": shared,  # declared once in rollway.common.shared_settings
        "bounds": bounds,  # an integer setting's range, when not INT_BOUNDS
        "limits": {k: v for k, v in limits.items() if v is not None},
    }
    if isinstance(default, list | dict | set):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag_name(field_name: str) -> str:
    """The command-line flag of a field: `max_tokens_per_gpu` -> `--max-tokens-per-gpu`."""
    return "--" + field_name.replace("_", "-")


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    # Cached: resolving the annotations is most of the cost of checking a config (StartRun's).
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _coerce_field(f: dataclasses.Field, tp: Any, name: str, value: Any, strict: bool = False) -> Any:
    """`value` as field `f` declares it: its type, integer bounds and limits."""
    limits = f.metadata.get("limits") or {}
    value = _coerce(name, tp, value, f.metadata.get("bounds"), strict)
    for index, item in enumerate(value if isinstance(value, list) else [value]):
        check_limits(f"{name}[{index}]" if isinstance(value, list) else name, item, limits)
    return value


def check_limits(name: str, value: Any, limits: Mapping[str, Any]) -> None:
    """Refuse a number or a string outside a setting's declared limits (None: unset, allowed)."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int | float):
        low, high = limits.get("minimum"), limits.get("maximum")
        above, below = limits.get("exclusiveMinimum"), limits.get("exclusiveMaximum")
        if (
            (low is not None and value < low)
            or (high is not None and value > high)
            or (above is not None and value <= above)
            or (below is not None and value >= below)
        ):
            words = describe_limits(limits)
            verb = "must not be" if words == "negative" else "must be"
            shown = f"{value:g}" if isinstance(value, float) and value.is_integer() else repr(value)
            raise ConfigError(name, f"{verb} {words} (got {shown})")
    if isinstance(value, str):
        if len(value) < limits.get("minLength", 0):
            raise ConfigError(name, "must not be empty")
        if "pattern" in limits and not re.search(limits["pattern"], value):
            words = PATTERN_WORDS.get(limits["pattern"], f"a match of {limits['pattern']}")
            raise ConfigError(name, f"must be {words} (got {value!r})")


def describe_limits(limits: Mapping[str, Any]) -> str:
    """A number's limits in words: 'positive', 'negative' (as 'must not be'), 'in [0, 1)',
    'at least 2'."""
    low, high = limits.get("minimum"), limits.get("maximum")
    above, below = limits.get("exclusiveMinimum"), limits.get("exclusiveMaximum")
    if high is None and below is None:
        if above == 0:
            return "positive"
        if low == 0:
            return "negative"
        if low is not None:
            return f"at least {low:g}"
        if above is not None:
            return f"greater than {above:g}"
    start = f"[{low:g}" if low is not None else f"({above:g}" if above is not None else "(-inf"
    end = f"{high:g}]" if high is not None else f"{below:g})" if below is not None else "inf)"
    return f"in {start}, {end}"


def _coerce(
    name: str, tp: Any, value: Any, bounds: tuple[int, int] | None = None, strict: bool = False
) -> Any:
    """Convert a YAML or flag value to the field's type, or raise ConfigError naming the field.
    Integers must lie in `bounds` (INT_BOUNDS by default); floats must be finite (NaN and
    infinities cannot be a learning rate, and protobuf's JSON cannot carry them). `strict` (the
    gRPC API, whose values are typed JSON) refuses text for a number or a boolean and a number for
    text, naming the expected type, instead of converting it as a command-line flag is."""
    inner, optional = _unwrap_optional(tp)
    if strict and value is not None:
        _check_json_type(name, inner, value)
    if value is None:
        if optional:
            return None
        raise ConfigError(name, "must be set (got null)")
    origin = typing.get_origin(inner)
    if origin is Literal:
        allowed = typing.get_args(inner)
        if value not in allowed:
            raise ConfigError(name, f"must be one of {', '.join(map(str, allowed))} (got {value!r})")
        return value
    if origin in (list, tuple):
        (item_tp, *_) = typing.get_args(inner) or (Any,)
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, list | tuple):
            raise ConfigError(name, f"must be a list (got {type(value).__name__})")
        return [_coerce(f"{name}[{i}]", item_tp, v, bounds, strict) for i, v in enumerate(value)]
    if origin is dict:
        if isinstance(value, str):  # a flag: a YAML mapping, e.g. --ray-trainer-resources '{node_a: 1}'
            try:
                value = yaml.safe_load(value) if value.strip() else {}
            except yaml.YAMLError:
                raise ConfigError(name, f"must be a mapping such as {{key: 1}} (got {value!r})") from None
        if not isinstance(value, Mapping):
            raise ConfigError(name, f"must be a mapping (got {type(value).__name__})")
        return dict(value)
    if inner is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(name, f"must be true or false (got {value!r})")
    if inner is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(name, f"must be an integer (got {value!r})")
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ConfigError(name, f"must be an integer (got {value!r})") from None
        low, high = bounds or INT_BOUNDS
        if not low <= number <= high:
            raise ConfigError(name, f"must be an integer in [{low}, {high}] (got {value!r})")
        return number
    if inner is float:
        if isinstance(value, bool):
            raise ConfigError(name, f"must be a number (got {value!r})")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(name, f"must be a number (got {value!r})") from None
        if not math.isfinite(number):
            raise ConfigError(name, f"must be a finite number (got {value!r})")
        return number
    if inner is str:
        if isinstance(value, Mapping | list):
            raise ConfigError(name, f"must be a string (got {type(value).__name__})")
        return str(value)
    return value


# The JSON type a strict value of each Python type must have (a Struct's numbers are all floats).
_JSON_TYPES = {
    bool: ("true or false", (bool,)),
    int: ("an integer", (int, float)),
    float: ("a number", (int, float)),
    str: ("a string", (str,)),
}


def _check_json_type(name: str, tp: Any, value: Any) -> None:
    origin = typing.get_origin(tp)
    if origin in (list, tuple) and not isinstance(value, list | tuple):
        raise ConfigError(name, f"must be a list (got {type(value).__name__} {value!r})")
    if tp not in _JSON_TYPES:
        return
    expected, types_ = _JSON_TYPES[tp]
    if not isinstance(value, types_) or (tp is not bool and isinstance(value, bool)):
        raise ConfigError(
            name, f"must be {expected} (got {type(value).__name__} {value!r}; values are not converted)"
        )


def from_dict(cls: type[T], data: Mapping[str, Any], *, base: T | None = None, require: bool = True) -> T:
    """Build `cls` from a mapping (keys may use - or _), on top of `base` or the defaults.

    A component's `check_required()` names a setting a run cannot go without (the model); with
    `require=False` it is skipped, for a service started bare and configured later by its run."""
    types_ = _field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = dataclasses.asdict(base) if base is not None else {}
    aliases = {a.replace("-", "_"): f.name for f in fields.values() for a in f.metadata.get("aliases", ())}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        key = aliases.get(key, key)
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(key, f"unknown setting for {cls.__name__}{hint}")
        values[key] = _coerce_field(fields[key], types_[key], key, value)
    missing = [
        name
        for name, f in fields.items()
        if name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(missing[0], "is required")
    config = cls(**values)
    for name, f in fields.items():
        choices = f.metadata.get("choices")
        if choices and getattr(config, name) not in choices:
            raise ConfigError(name, choice_problem(choices, getattr(config, name)))
    check_required = getattr(config, "check_required", None)
    if require and check_required is not None:
        check_required()
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config


def coerce_setting(cls: type, name: str, value: Any, *, strict: bool = False) -> Any:
    """`value` converted to the type of field `name` of `cls` (ConfigError naming it otherwise);
    no cross-field validation, so each value of a config can be checked on its own."""
    declared = next(f for f in dataclasses.fields(cls) if f.name == name)
    value = _coerce_field(declared, _field_types(cls)[name], name, value, strict)
    choices = declared.metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(name, choice_problem(choices, value))
    return value


def choice_problem(choices: Sequence[Any], value: Any) -> str:
    """Why `value` is refused: the allowed values ('' shown as such) and the closest one."""
    shown = ", ".join("'' (empty)" if c == "" else str(c) for c in choices)
    names = [str(c) for c in choices if c != ""]
    close = difflib.get_close_matches(str(value), names, n=1) if isinstance(value, str) else []
    return f"must be one of {shown} (got {value!r})" + (f"; did you mean {close[0]}?" if close else "")


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing or malformed file is a ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("config", f"file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping of settings")
    return data


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per field of `cls`. Flags default to SUPPRESS so only given ones override.

    A field whose flag another component already added (a shared setting) is skipped.
    """
    types_ = _field_types(cls)
    group = parser.add_argument_group(cls.__name__, (cls.__doc__ or "").strip().splitlines()[0] or None)
    taken = {opt for action in parser._actions for opt in action.option_strings}
    for f in dataclasses.fields(cls):
        if flag_name(f.name) in taken:
            continue
        tp, _ = _unwrap_optional(types_[f.name])
        doc = f.metadata.get("doc", "")
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS}
        kwargs["help"] = f"{doc} (default: {default!r})" if doc else f"(default: {default!r})"
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(tp) in (list, tuple):
            kwargs["nargs"] = "*"
        elif typing.get_origin(tp) is Literal:
            kwargs["choices"] = typing.get_args(tp)
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        names = [flag_name(f.name), *(flag_name(a) for a in f.metadata.get("aliases", ()))]
        group.add_argument(*names, **kwargs)


def parse(
    cls: type[T],
    argv: Sequence[str] | None = None,
    *,
    prog: str | None = None,
    description: str | None = None,
) -> T:
    """Parse `--config FILE` plus per-field flags into `cls` (flags win over the file).

    Exits with status 2 and a message naming the setting on a configuration error.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="YAML file with settings (flags override it)")
    add_flags(parser, cls)
    args = vars(parser.parse_args(argv))
    try:
        data = load_yaml(args.pop("config")) if args.get("config") else {}
        args.pop("config", None)
        return from_dict(cls, {**data, **args})
    except ConfigError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def check_shared_settings(classes: Sequence[type]) -> None:
    """A setting may be declared by several components (Miles' flags are one flat namespace:
    `hf_checkpoint` matters to the trainer, the rollout engine and the dataloader), but only with
    one default, so that an unset value means the same thing to each of them. The accepted
    values may differ (the trainer knows flash_attention_2; the CPU engine does not): each
    component validates the value for itself."""
    seen: dict[str, tuple[type, Any]] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            default = f.default
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            if f.name in seen and seen[f.name][1] != default:
                other = seen[f.name][0]
                raise TypeError(
                    f"setting {f.name} has different defaults in {other.__name__} ({seen[f.name][1]!r}) "
                    f"and {cls.__name__} ({default!r})"
                )
            seen.setdefault(f.name, (cls, default))


def parse_components(
    classes: Sequence[type],
    argv: Sequence[str] | None = None,
    *,
    prog: str | None = None,
    description: str | None = None,
    run_config_keys: Callable[[], set[str]] | None = None,
    require: bool = True,
    given: dict[str, Any] | None = None,
) -> list[Any]:
    """Like `parse` for several component dataclasses sharing one flat namespace of flags and keys.

    Each YAML key or flag goes to every component that declares it (see check_shared_settings).
    Returns one instance per class, in order.

    With `run_config_keys` (the keys of every component of a run), `--run-config FILE` is added:
    a whole run's flat config, of which these components take the keys they declare and ignore
    the keys only other components declare; a key that no component declares is still an error.
    `--config FILE` stays strict and overrides it; flags override both.
    """
    owners: dict[str, list[type]] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            owners.setdefault(f.name, []).append(cls)
            for alias in f.metadata.get("aliases", ()):
                owners.setdefault(alias.replace("-", "_"), []).append(cls)
    check_shared_settings(classes)
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="YAML file with settings (flags override it)")
    if run_config_keys is not None:
        parser.add_argument(
            "--run-config",
            help="YAML run config holding every component's settings; only this service's are taken "
            "(--config and flags override it)",
        )
    for cls in classes:
        add_flags(parser, cls)
    args = vars(parser.parse_args(argv))
    config_path = args.pop("config", None)
    run_config_path = args.pop("run_config", None)
    try:
        data = _run_config_part(run_config_path, owners, run_config_keys) if run_config_path else {}
        data.update(
            {str(k).replace("-", "_"): v for k, v in (load_yaml(config_path) if config_path else {}).items()}
        )
        data.update(args)
        if given is not None:  # the settings as given (file then flags), for a caller passing them on
            given.update(data)
        for key in data:
            if key not in owners:
                close = difflib.get_close_matches(key, owners, n=1)
                raise ConfigError(key, "unknown setting" + (f"; did you mean {close[0]}?" if close else ""))
        return [
            from_dict(cls, {k: v for k, v in data.items() if cls in owners[k]}, require=require)
            for cls in classes
        ]
    except ConfigError as exc:
        parser.error(str(exc))
        raise


def _run_config_part(
    path: str, owners: Mapping[str, Any], run_config_keys: Callable[[], set[str]]
) -> dict[str, Any]:
    """The keys of a run config that `owners` declare; keys of other run components are dropped.

    Only run settings count: a process setting (port, host, ...) in a run config is an error here
    as it is for `rollway run`, so one run config never gives every service the same port.
    """
    known = run_config_keys()
    part = {}
    for raw_key, value in load_yaml(path).items():
        key = str(raw_key).replace("-", "_")
        if key in known:
            if key in owners:
                part[key] = value
        else:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(key, f"unknown setting in run config {path} (no component declares it){hint}")
    return part


def non_default_settings(config: Any) -> dict[str, Any]:
    """The settings of `config` that differ from its dataclass defaults (what a service is told)."""
    out = {}
    for f in dataclasses.fields(config):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = getattr(config, f.name)
        if value != default or default is dataclasses.MISSING:
            out[f.name] = value
    return out


def to_dict(config: Any) -> dict[str, Any]:
    """Plain-data view of a config dataclass (for logs, Describe and checkpoints)."""
    return dataclasses.asdict(config)
