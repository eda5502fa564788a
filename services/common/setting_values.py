"""A setting's value, checked and converted to what its field declares, one value at a time.

The field's type (a YAML or flag value becomes its int, float, bool, list, mapping or Literal),
the declared limits and choices, and ConfigError, which names the setting a value is wrong for.
Also `load_object`: a `module:attr` value resolved to the user's object it names.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import yaml

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


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of each field of dataclass `cls`, by field name."""
    # Cached: resolving the annotations is most of the cost of checking a config (StartRun's).
    return typing.get_type_hints(cls)


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """`X | None` as (X, True); any other type as (itself, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def coerce_field(f: dataclasses.Field, tp: Any, name: str, value: Any, strict: bool = False) -> Any:
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
    inner, optional = unwrap_optional(tp)
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


def coerce_setting(cls: type, name: str, value: Any, *, strict: bool = False) -> Any:
    """`value` converted to the type of field `name` of `cls` (ConfigError naming it otherwise);
    no cross-field validation, so each value of a config can be checked on its own."""
    declared = next(f for f in dataclasses.fields(cls) if f.name == name)
    value = coerce_field(declared, field_types(cls)[name], name, value, strict)
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
