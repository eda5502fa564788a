"""GetConfigSchema is the validator: configs generated from the schema (hypothesis-jsonschema) that
it accepts, StartRun's validation accepts, unless a refusal names a rule the schema lists under
x-rollway-rules; configs with one value the schema refuses, StartRun refuses naming that setting.
In-process for the thousand configs (parse_run_config as StartRun calls it), then a few over gRPC."""

from __future__ import annotations

import json
import re

import grpc
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from support.processes import ServiceProcess
from support.stack import coordinator_stub

from rollway.common.structs import to_struct
from rollway.coordinator.config_schema import run_config_schema
from rollway.coordinator.run_config import RunConfigError, parse_run_config
from rollway.coordinator.v1 import coordinator_pb2

SCHEMA = run_config_schema()
PROPERTIES = SCHEMA["properties"]
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
RULE_SETTINGS = {s for rule in SCHEMA["x-rollway-rules"] for s in rule["settings"]}
# The run's model, data and attached addresses stay the base's: a random path names no file and
# a random address would be dialled (both refusals are listed rules, and would drown the rest).
FIXED = {
    "hf_checkpoint",
    "prompt_data",
    "prompt_data_weights",
    "eval_prompt_data",
    "input_key",
    "label_key",
    "trainer_addr",
    "rollout_addr",
    "dataloader_addr",
}
FUZZED = sorted(set(PROPERTIES) - FIXED)
ALIASES = {
    k: v["description"].removeprefix("alias of ")
    for k, v in PROPERTIES.items()
    if "alias of" in v["description"]
}
NUM_EXAMPLES = 500  # each of the two tests: 1,000 generated configs in all
FUZZ = settings(
    max_examples=NUM_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def base(tiny_model_dir, demo_data_dir) -> dict:
    """A valid RL run (the schema and StartRun both accept it)."""
    config = {
        "hf_checkpoint": str(tiny_model_dir),
        "prompt_data": [str(demo_data_dir / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "rollout_max_response_len": 64,  # the default (1024) leaves the tiny model no room for a prompt
    }
    assert VALIDATOR.is_valid(config)
    parse_run_config(config, check_files=True, strict=True)
    return config


def verdict(config: dict) -> set[str] | None:
    """The settings StartRun's validation names (None: accepted); list items name their list."""
    try:
        parse_run_config(config, check_files=True, strict=True)
    except RunConfigError as exc:
        return {re.sub(r"\[\d+\]$", "", setting) for setting, _ in exc.problems}
    return None


def _base_type(schema: dict) -> str:
    if "anyOf" in schema:
        return _base_type(schema["anyOf"][0])
    return schema.get("type", "string")  # an enum of names


def _valid(schema: dict):
    """Values the property's schema accepts. Objects are drawn here: hypothesis-jsonschema 0.23.1
    draws them with an internal of Hypothesis that 6.170 no longer has."""
    if schema.get("type") != "object":
        return from_schema(schema)
    if "properties" in schema:  # trainer_settings: some trainer settings
        keys = st.lists(st.sampled_from(sorted(schema["properties"])), max_size=3, unique=True)
        return keys.flatmap(
            lambda ks: st.fixed_dictionaries({k: _valid(schema["properties"][k]) for k in ks})
        )
    values = schema.get("additionalProperties")
    return st.dictionaries(st.text(max_size=8), from_schema(values) if values else st.integers(), max_size=3)


def _invalid(schema: dict):
    """Values the property's schema refuses: of its JSON type but outside its constraints, or of
    another type."""
    kind = _base_type(schema)
    numeric = kind in ("integer", "number")
    others = [
        t for t in ("string", "number", "boolean", "null") if t != kind and not (numeric and t == "number")
    ]
    other_types = from_schema({"type": others})
    if kind == "object":
        if "properties" in schema:
            return st.one_of(other_types, st.just({"not_a_setting": 1}), st.just({"lr": -1.0}))
        return other_types
    same_type = from_schema({"allOf": [{"type": kind}, {"not": schema}]})
    # A nullable setting (anyOf [..., null]) accepts None, which `others` would draw.
    refused = jsonschema.Draft202012Validator(schema)
    return st.one_of(same_type, other_types).filter(lambda value: not refused.is_valid(value))


_values = {k: _valid(PROPERTIES[k]) for k in FUZZED}
_bad_values = {k: _invalid(PROPERTIES[k]) for k in FUZZED}


@st.composite
def overlays(draw, bad: bool):
    """A few settings with schema-valid values, and with `bad` one more the schema refuses."""
    keys = draw(st.lists(st.sampled_from(FUZZED), max_size=6, unique=True))
    overlay = {k: draw(_values[k]) for k in keys}
    if not bad:
        return overlay, None
    key = draw(st.sampled_from(FUZZED))
    overlay.pop(ALIASES.get(key, key), None)
    overlay = {k: v for k, v in overlay.items() if ALIASES.get(k) != key}
    overlay[key] = draw(_bad_values[key])
    return overlay, key


counts = {"accepted": 0, "rule": 0, "refused": 0}


def test_every_schema_valid_config_is_accepted_or_refused_by_a_listed_rule(base):
    @FUZZ
    @given(overlays(bad=False))
    def check(drawn):
        overlay, _ = drawn
        config = {**base, **overlay}
        assert VALIDATOR.is_valid(config), list(VALIDATOR.iter_errors(config))[:1]
        named = verdict(config)
        counts["accepted" if named is None else "rule"] += 1
        unlisted = (named or set()) - RULE_SETTINGS
        assert not unlisted, f"{overlay}: refused naming {unlisted}, which no x-rollway-rules entry lists"

    check()
    # The test means something only if the server accepts most of them.
    assert counts["accepted"] > NUM_EXAMPLES // 2, counts


def test_every_config_with_a_value_the_schema_refuses_is_refused_naming_that_setting(base):
    @FUZZ
    @given(overlays(bad=True))
    def check(drawn):
        overlay, key = drawn
        config = {**base, **overlay}
        assert not VALIDATOR.is_valid(config)
        named = verdict(config)
        assert named is not None, f"{key}={overlay[key]!r}: the schema refuses it, StartRun accepts it"
        assert ALIASES.get(key, key) in named or key in named, (key, overlay[key], named)
        counts["refused"] += 1

    check()
    assert counts["refused"] == NUM_EXAMPLES


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("schema-run-api")
    with ServiceProcess(
        "coordinator", ["--runs-root", str(workdir / "runs"), "--dashboard-port", "0"], workdir
    ) as c:
        yield c


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("global_batch_size", -4),
        ("lr", -1.0),
        ("rm_type", "bogus"),
        ("advantage_estimator", "ppo"),
        ("rollout_top_p", 0.0),
        ("adam_beta2", 1.0),
        ("custom_rm_path", "no_colon"),
        ("run_id", "../escape"),
    ],
)
def test_the_served_schema_and_start_run_refuse_the_same_values(coordinator, base, setting, value):
    stub = coordinator_stub(coordinator)
    served = json.loads(stub.GetConfigSchema(coordinator_pb2.GetConfigSchemaRequest()).json_schema)
    config = {**base, setting: value}
    assert not jsonschema.Draft202012Validator(served).is_valid(config)
    with pytest.raises(grpc.RpcError) as refused:
        stub.StartRun(coordinator_pb2.StartRunRequest(config=to_struct(config)))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"config.{setting}" in refused.value.details()
    # The same config with the schema's default for that setting is valid for both.
    fixed = {**base, setting: served["properties"][setting]["default"]}
    assert jsonschema.Draft202012Validator(served).is_valid(fixed)
    reply = stub.ValidateRun(coordinator_pb2.ValidateRunRequest(config=to_struct(fixed)))
    assert reply.num_steps == 10
