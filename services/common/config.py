"""Typed configuration: dataclasses loaded from YAML and overridden by command-line flags.

A component declares one dataclass whose fields use `setting(default, "one-line doc")`. The
command-line flags are generated from the fields (`lr_warmup_iters` -> `--lr-warmup-iters`), so
they are never written twice. Values are checked once, at the edge: a wrong type, an unknown key
or a failed `validate()` raises ConfigError naming the setting.

This module declares a setting and is the machinery's one import for the services; its parts:

    setting_values   one value: its type, limits and choices; ConfigError; load_object
    config_dicts     a dataclass from a mapping (from_dict) and back (to_dict, non_default_settings)
    config_flags     the generated flags, and parse / parse_components of a process's settings

None of them imports torch: entry points parse their configuration first, so `--help` and
configuration errors are instant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rollway.common.config_dicts import from_dict, non_default_settings, to_dict
from rollway.common.config_flags import add_flags, check_shared_settings, flag_name, parse, parse_components
from rollway.common.setting_values import (
    CALCULATOR_OR_MODULE_ATTR,
    INT_BOUNDS,
    KEY_EQUALS_VALUE,
    MODULE_ATTR_OR_EMPTY,
    RUN_ID,
    RUN_ID_OR_EMPTY,
    ConfigError,
    coerce_setting,
    load_object,
)

# The names the services import from here (each defined in one of the parts above).
__all__ = [
    "CALCULATOR_OR_MODULE_ATTR",
    "INT_BOUNDS",
    "KEY_EQUALS_VALUE",
    "MODULE_ATTR_OR_EMPTY",
    "RUN_ID",
    "RUN_ID_OR_EMPTY",
    "ConfigError",
    "add_flags",
    "check_shared_settings",
    "coerce_setting",
    "flag_name",
    "from_dict",
    "load_object",
    "non_default_settings",
    "parse",
    "parse_components",
    "setting",
    "to_dict",
]


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
