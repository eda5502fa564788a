"""Command-line flags generated from config dataclasses, and the parsing of a process's settings.

One flag per field (`lr_warmup_iters` -> `--lr-warmup-iters`), so flags are never written twice.
`parse` reads one component's `--config FILE` and flags; `parse_components` several components
sharing one flat namespace (a service's settings and its server's), optionally with the part of
a whole run's config (`--run-config FILE`) that they declare.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from rollway.common.config_dicts import from_dict
from rollway.common.setting_values import ConfigError, field_types, unwrap_optional

T = TypeVar("T")


def flag_name(field_name: str) -> str:
    """The command-line flag of a field: `max_tokens_per_gpu` -> `--max-tokens-per-gpu`."""
    return "--" + field_name.replace("_", "-")


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
    types_ = field_types(cls)
    group = parser.add_argument_group(cls.__name__, (cls.__doc__ or "").strip().splitlines()[0] or None)
    taken = {opt for action in parser._actions for opt in action.option_strings}
    for f in dataclasses.fields(cls):
        if flag_name(f.name) in taken:
            continue
        tp, _ = unwrap_optional(types_[f.name])
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
