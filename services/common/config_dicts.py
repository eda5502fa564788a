"""A config dataclass built from a mapping (a YAML file's, a flag's, an RPC's) and back.

`from_dict` checks each value (rollway.common.setting_values), then the choices, the settings a
run cannot go without and the component's own `validate()`; `to_dict` and
`non_default_settings` give the plain data a service logs, describes or is told.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, TypeVar

from rollway.common.setting_values import ConfigError, choice_problem, coerce_field, field_types

T = TypeVar("T")


def from_dict(cls: type[T], data: Mapping[str, Any], *, base: T | None = None, require: bool = True) -> T:
    """Build `cls` from a mapping (keys may use - or _), on top of `base` or the defaults.

    A component's `check_required()` names a setting a run cannot go without (the model); with
    `require=False` it is skipped, for a service started bare and configured later by its run."""
    types_ = field_types(cls)
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
        values[key] = coerce_field(fields[key], types_[key], key, value)
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
