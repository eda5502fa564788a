"""The run config as a JSON Schema, generated from the dataclasses StartRun validates with.

One declaration per setting (common/config.py's `setting`): its type, default, choices, integer
range and doc become the schema's type, default, enum, minimum/maximum and description, so a UI
can build a form and a client can check a config offline with what the server checks.
Cross-setting rules (batch arithmetic, files, models) are StartRun's and ValidateRun's only.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from rollway.common.config import INT_BOUNDS
from rollway.coordinator.run_config import COMPONENTS

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def run_config_schema() -> dict[str, Any]:
    """The flat run config: one property per setting (shared settings once), aliases included."""
    properties: dict[str, Any] = {}
    for component, cls in COMPONENTS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in properties:
                continue  # a shared setting: declared with one type and default everywhere
            prop = _type_schema(hints[f.name], f.metadata.get("bounds"))
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if default is not dataclasses.MISSING:
                prop["default"] = list(default) if isinstance(default, tuple) else default
            if f.metadata.get("choices"):
                prop["enum"] = list(f.metadata["choices"])
            prop["description"] = f.metadata.get("doc", "")
            prop["x-rollway-component"] = component
            properties[f.name] = prop
            for alias in f.metadata.get("aliases", ()):
                properties[alias.replace("-", "_")] = {**prop, "description": f"alias of {f.name}"}
    return {
        "$schema": DRAFT,
        "title": "rollway run config",
        "description": "The flat settings of one run (the YAML of `rollway run`, StartRun's config).",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }


def _type_schema(tp: Any, bounds: tuple[int, int] | None) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [_type_schema(a, bounds) for a in typing.get_args(tp) if a is not type(None)]
        nullable = type(None) in typing.get_args(tp)
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return {"anyOf": [schema, {"type": "null"}]} if nullable else schema
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (list, tuple):
        (item,) = typing.get_args(tp)[:1] or (Any,)
        return {"type": "array", "items": _type_schema(item, bounds)}
    if origin is dict and typing.get_args(tp)[1:] == (float,):  # e.g. custom resource -> amount
        return {"type": "object", "additionalProperties": {"type": "number"}}
    if origin is dict or tp is dict:
        return {"type": "object"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        low, high = bounds or INT_BOUNDS
        return {"type": "integer", "minimum": low, "maximum": high}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    return {}
