"""The run config as a JSON Schema, generated from the dataclasses StartRun validates with.

One declaration per setting (common/config.py's `setting`): its type, default, choices, integer
bounds and limits (minimum, exclusive bounds, pattern, ...) become the schema's type, default,
enum, minimum/maximum and pattern, and the config loader refuses a value by the same declaration.
A setting several components declare is one property holding every declaration's constraint
(StartRun checks the value against each). So a value the schema accepts on its own is one
StartRun accepts on its own, and the other way round.

What JSON Schema cannot say (rules across settings, files, the model, the data) is StartRun's and
ValidateRun's; each such rule is listed under `x-rollway-rules`, naming the settings a refusal by
it names, so a client knows which refusals only the server can give.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from rollway.common.config import INT_BOUNDS
from rollway.coordinator.run_config import COMPONENTS
from rollway.rollout.config import PROCESS_SETTINGS

DRAFT = "https://json-schema.org/draft/2020-12/schema"

# Rules across settings (or about the world) that StartRun checks and the schema cannot express:
# (rule, settings a refusal by it names, what it says). tests/integration/test_run_config_fuzz.py
# checks that every refusal of a schema-valid config names a setting of one of these.
SERVER_RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "required-by-started-services",
        ("hf_checkpoint", "prompt_data"),
        "the services the coordinator starts need a model and (the dataloader) prompt data",
    ),
    (
        "files-and-model",
        ("hf_checkpoint", "prompt_data", "prompt_data_weights", "eval_prompt_data", "input_key", "label_key"),
        "the model directory and data files exist and parse; data sources are name path pairs with "
        "one weight each; the data has the input and label columns",
    ),
    (
        "context-length",
        ("rollout_max_response_len",),
        "rollout_max_response_len (plus rollout_max_prompt_len) fits the model's context",
    ),
    (
        "batch-arithmetic",
        ("global_batch_size", "num_steps_per_rollout", "over_sampling_batch_size"),
        "global_batch_size divides rollout_batch_size * n_samples_per_prompt (rollout_batch_size for "
        "SFT), num_steps_per_rollout agrees with it; over_sampling_batch_size is 0 or at least "
        "rollout_batch_size",
    ),
    (
        "end-of-data",
        ("num_epoch", "num_rollout"),
        "num_rollout 0 runs num_epoch epochs: a positive num_epoch, data the coordinator can count, "
        "at least one full batch",
    ),
    (
        "debug-modes",
        ("debug_rollout_only",),
        "debug_rollout_only excludes debug_train_only, load_debug_rollout_data and sft_loss",
    ),
    (
        "partial-rollout",
        ("partial_rollout", "mask_offpolicy_in_partial_rollout"),
        "partial_rollout needs dynamic_sampling_filter_path and no agent environment; "
        "mask_offpolicy_in_partial_rollout needs partial_rollout",
    ),
    (
        "launcher-ray",
        (
            "ray_address",
            "ray_placement_strategy",
            "ray_trainer_num_cpus",
            "ray_trainer_num_gpus",
            "ray_rollout_num_cpus",
            "ray_dataloader_num_cpus",
            "ray_trainer_resources",
            "ray_rollout_resources",
            "ray_dataloader_resources",
            "remote_environment",
            "openenv_app",
        ),
        "Ray settings need launcher ray (custom resources: no CPU/GPU/memory names, non-negative "
        "amounts); a managed environment is not started on Ray",
    ),
    (
        "environment-source",
        (
            "environment_url",
            "remote_environment",
            "openenv_url",
            "openenv_app",
            "custom_generate_function_path",
            "agent_function_path",
            "verifiers_taskset",
        ),
        "each environment has exactly one source: remote (environment_url or remote_environment), "
        "openenv (openenv_url or openenv_app), custom, agent, verifiers their module:attr; a managed "
        "environment needs a rollout service (not sft, not debug_train_only)",
    ),
    (
        "reward-source",
        ("rm_url", "custom_rm_path", "group_rm"),
        "the remote reward (reward or rm_type remote) needs rm_url, the custom one custom_rm_path; "
        "group_rm needs custom_rm_path",
    ),
    (
        "chat-template",
        ("apply_chat_template", "chat_template_path"),
        "SFT data and chat_template_path need apply_chat_template",
    ),
    (
        "sglang-gpus",
        ("rollout_num_gpus",),
        "launched SGLang servers: rollout_num_gpus is a multiple of rollout_num_gpus_per_engine",
    ),
    (
        "trainer-schedule",
        ("min_lr", "lr_decay_iters"),
        "min_lr does not exceed lr; a decaying schedule ends after its warmup",
    ),
    (
        "trainer-ranks",
        ("attn_implementation", "master_port"),
        "flash_attention_2 needs the flash-attn package; ranks started elsewhere need master_port",
    ),
    (
        "trainer-lora",
        ("lora_alpha", "lora_target_modules"),
        "LoRA (lora_rank > 0) needs a positive lora_alpha and target modules",
    ),
    (
        "rl-loss",
        (
            "rollout_temperature",
            "tis_clip",
            "mis_high",
            "geo_mask_high",
            "use_tis",
            "use_mis",
            "use_geo_mask",
            "calculate_per_token_loss",
            "kl_coef",
        ),
        "policy_loss needs a positive rollout_temperature; each upper correction bound is at least "
        "its lower one; corrections exclude use_rollout_logprobs and each other (TIS or MIS); dr_grpo "
        "excludes per-token loss; kl_coef excludes use_kl_loss and needs a token-level estimator",
    ),
)


def run_config_schema() -> dict[str, Any]:
    """The flat run config: one property per setting (shared settings once), aliases included.
    Settings of a rollout process (PROCESS_SETTINGS) are no run's: they are not properties."""
    declarations: dict[str, list[tuple[str, dataclasses.Field, Any]]] = {}
    for component, cls in COMPONENTS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name not in PROCESS_SETTINGS:
                declarations.setdefault(f.name, []).append((component, f, hints[f.name]))
    properties: dict[str, Any] = {}
    for name, declared in declarations.items():
        component, first, _ = declared[0]
        prop = _merged([_field_schema(f, hint) for _, f, hint in declared])
        default = (
            first.default_factory() if first.default_factory is not dataclasses.MISSING else first.default
        )
        if default is not dataclasses.MISSING:
            prop["default"] = list(default) if isinstance(default, tuple) else default
        prop["description"] = first.metadata.get("doc", "")
        prop["x-rollway-component"] = component
        properties[name] = prop
        if name == "trainer_settings":  # trainer settings, checked as the trainer's own are
            prop.update(properties=_trainer_properties(), additionalProperties=False)
        for alias in first.metadata.get("aliases", ()):
            properties[alias.replace("-", "_")] = {**prop, "description": f"alias of {name}"}
    return {
        "$schema": DRAFT,
        "title": "rollway run config",
        "description": "The flat settings of one run (the YAML of `rollway run`, StartRun's config).",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "x-rollway-rules": [
            {"rule": rule, "settings": list(settings), "description": description}
            for rule, settings, description in SERVER_RULES
        ],
    }


def _trainer_properties() -> dict[str, Any]:
    cls = COMPONENTS["trainer"]
    hints = typing.get_type_hints(cls)
    return {f.name: _field_schema(f, hints[f.name]) for f in dataclasses.fields(cls)}


def _field_schema(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """One declaration's constraint: type, integer bounds, limits and choices."""
    limits = dict(f.metadata.get("limits") or {})
    schema = _type_schema(hint, f.metadata.get("bounds"), limits)
    if f.metadata.get("choices"):
        _scalar(schema)["enum"] = list(f.metadata["choices"])
    return schema


def _scalar(schema: dict[str, Any]) -> dict[str, Any]:
    """The part of a property that constrains a value (not null, not the list around it)."""
    if "anyOf" in schema and schema["anyOf"][-1] == {"type": "null"}:
        return _scalar(schema["anyOf"][0])
    return schema["items"] if schema.get("type") == "array" else schema


def _merged(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    """A setting declared by several components accepts what every declaration accepts: the
    enums intersected, the tightest bounds (the declarations share a type: check_shared_settings)."""
    merged = dict(schemas[0])
    for other in schemas[1:]:
        target, source = _scalar(merged), _scalar(other)
        if "enum" in source:
            target["enum"] = [v for v in target.get("enum", source["enum"]) if v in source["enum"]]
        for key, pick in (
            ("minimum", max),
            ("exclusiveMinimum", max),
            ("maximum", min),
            ("exclusiveMaximum", min),
        ):
            if key in source:
                target[key] = pick(target[key], source[key]) if key in target else source[key]
        for key in ("type", "pattern", "minLength"):
            if key in source:
                target.setdefault(key, source[key])
    return merged


def _type_schema(tp: Any, bounds: tuple[int, int] | None, limits: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [_type_schema(a, bounds, limits) for a in typing.get_args(tp) if a is not type(None)]
        nullable = type(None) in typing.get_args(tp)
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return {"anyOf": [schema, {"type": "null"}]} if nullable else schema
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (list, tuple):
        (item,) = typing.get_args(tp)[:1] or (Any,)
        return {"type": "array", "items": _type_schema(item, bounds, limits)}
    if origin is dict and typing.get_args(tp)[1:] == (float,):  # e.g. custom resource -> amount
        return {"type": "object", "additionalProperties": {"type": "number"}}
    if origin is dict or tp is dict:
        return {"type": "object"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        low, high = bounds or INT_BOUNDS
        schema = {"type": "integer", "minimum": low, "maximum": high}
        for key, pick in (("minimum", max), ("maximum", min)):
            if key in limits:
                schema[key] = pick(schema[key], limits[key])
        schema.update({k: v for k, v in limits.items() if k not in schema})
        return schema
    if tp is float:
        return {"type": "number", **limits}
    if tp is str:
        return {"type": "string", **limits}
    return {}
