"""The run API refuses a bad run before anything is registered, all at once, with structured errors
a client maps to fields; ValidateRun and GetConfigSchema answer from the same declarations.
A real coordinator on loopback; no run here starts a service."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import jsonschema
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from support.processes import ServiceProcess
from support.stack import coordinator_stub

from rollway.common.structs import to_struct
from rollway.coordinator.v1 import coordinator_pb2


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run-api")
    with ServiceProcess(
        "coordinator", ["--runs-root", str(workdir / "runs"), "--dashboard-port", "0"], workdir
    ) as c:
        yield c, workdir / "runs"


def sft(model: Path, data: Path, **overrides) -> dict:
    return {
        "hf_checkpoint": str(model),
        "prompt_data": [str(data / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "loss_type": "sft_loss",
        "rollout_batch_size": 8,
        "global_batch_size": 8,
        "num_rollout": 2,
        **overrides,
    }


def refusal(call) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """The status code, message and field -> problem of the details of a refused call."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    status = rpc_status.from_call(caught.value)
    assert status is not None, f"no google.rpc.Status details: {caught.value.details()}"
    fields = {}
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields.update({v.field: v.description for v in bad.field_violations})
        elif detail.Is(error_details_pb2.PreconditionFailure.DESCRIPTOR):
            failure = error_details_pb2.PreconditionFailure()
            detail.Unpack(failure)
            fields.update({v.subject: v.description for v in failure.violations})
    return caught.value.code(), caught.value.details(), fields


def start(stub, config: dict, run_id: str = ""):
    return stub.StartRun(coordinator_pb2.StartRunRequest(config=to_struct(config), run_id=run_id))


@pytest.mark.parametrize(
    ("setting", "value"),
    [("num_rollout", 1e20), ("num_rollout", float(2**63)), ("rollout_batch_size", 1e12)],
)
def test_an_out_of_range_number_is_refused_naming_its_range_and_nothing_is_registered(
    coordinator, tiny_model_dir, demo_data_dir, setting, value
):
    service, runs_root = coordinator
    stub = coordinator_stub(service)
    before = stub.ListRuns(coordinator_pb2.ListRunsRequest()).runs
    code, message, fields = refusal(
        lambda: start(stub, sft(tiny_model_dir, demo_data_dir, **{setting: value}), f"huge-{setting}")
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"config.{setting}" in fields
    assert f"[{-(2**31)}, {2**31 - 1}]" in fields[f"config.{setting}"]
    assert message.startswith(f"config.{setting}: must be an integer in")
    after = stub.ListRuns(coordinator_pb2.ListRunsRequest()).runs  # answers: no run broke it
    assert [r.run_id for r in after] == [r.run_id for r in before]
    assert not (runs_root / f"huge-{setting}").exists()
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetRun(coordinator_pb2.GetRunRequest(run_id=f"huge-{setting}"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_lr_is_invalid_argument_naming_config_lr(
    coordinator, tiny_model_dir, demo_data_dir, value
):
    stub = coordinator_stub(coordinator[0])
    code, message, fields = refusal(lambda: start(stub, sft(tiny_model_dir, demo_data_dir, lr=value)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert list(fields) == ["config.lr"]
    assert "must be a finite number" in fields["config.lr"]
    assert "config.lr" in message


def test_every_problem_at_once_each_a_field_violation(coordinator, tiny_model_dir, demo_data_dir, tmp_path):
    """An unknown key hides nothing: a bad value, a bad column, an unknown reward and a cross-setting
    problem are reported with it, each as its own FieldViolation."""
    stub = coordinator_stub(coordinator[0])
    config = {
        "hf_checkpoint": str(tiny_model_dir),
        "prompt_data": [str(demo_data_dir / "rl.parquet")],
        "input_key": "no_such_column",
        "label_key": "label",
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "global_batch_size": 16,
        "rollout_max_response_len": 8,
        "lrr": 1e-3,  # unknown
        "rollout_temperature": -1.0,  # validate(): must not be negative
        "rm_type": "exact_matsh",
        "num_steps_per_rollout": 3,  # does not divide 16 samples
    }
    code, message, fields = refusal(lambda: start(stub, config))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(fields) == {
        "config.lrr",
        "config.rollout_temperature",
        "config.input_key",
        "config.rm_type",
        "config.num_steps_per_rollout",
    }, message
    assert "did you mean lr" in fields["config.lrr"]
    assert "'no_such_column' is no column" in fields["config.input_key"]
    assert "did you mean exact_match" in fields["config.rm_type"]
    assert all(f"{field}: {problem}" in message for field, problem in fields.items())


def test_a_missing_data_file_or_a_dead_attached_service_is_failed_precondition(
    coordinator, tiny_model_dir, demo_data_dir, tmp_path
):
    stub = coordinator_stub(coordinator[0])
    missing = tmp_path / "gone.parquet"
    code, _, fields = refusal(
        lambda: start(stub, sft(tiny_model_dir, demo_data_dir, prompt_data=[str(missing)]))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert fields == {"config.prompt_data": f"{missing}: no such file"}
    # A port nothing listens on (one just freed by the OS would do as well).
    code, _, fields = refusal(
        lambda: start(stub, sft(tiny_model_dir, demo_data_dir, trainer_addr="127.0.0.1:9"))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert list(fields) == ["config.trainer_addr"]
    assert "does not answer" in fields["config.trainer_addr"]


def test_validate_run_plans_num_epoch_runs_up_front_in_under_a_second(
    coordinator, tiny_model_dir, demo_data_dir
):
    stub = coordinator_stub(coordinator[0])
    config = sft(tiny_model_dir, demo_data_dir, prompt_data=[str(demo_data_dir / "sft.parquet") + "@[0:20]"])
    started = time.monotonic()
    reply = stub.ValidateRun(
        coordinator_pb2.ValidateRunRequest(config=to_struct({**config, "num_rollout": 0, "num_epoch": 3}))
    )
    assert time.monotonic() - started < 1.0
    assert reply.num_rows == 20
    assert reply.num_steps == 3 * 20 // 8 == 7
    assert "num_epoch 3 x 20 rows / rollout_batch_size 8 = 7 steps" in reply.end_of_data
    assert "end of data" in reply.plan
    assert reply.config["coordinator"]["num_rollout"] == 7
    loops = stub.ValidateRun(
        coordinator_pb2.ValidateRunRequest(config=to_struct({**config, "num_rollout": 9}))
    )
    assert loops.num_steps == 9
    assert loops.num_epochs == pytest.approx(9 * 8 / 20)
    code, _, fields = refusal(
        lambda: stub.ValidateRun(
            coordinator_pb2.ValidateRunRequest(config=to_struct({**config, "num_rollout": 0, "num_epoch": 0}))
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert list(fields) == ["config.num_epoch"]
    assert stub.ListRuns(coordinator_pb2.ListRunsRequest()).runs == []  # nothing registered


def test_the_config_schema_describes_every_setting_and_checks_a_config_offline(
    coordinator, tiny_model_dir, demo_data_dir
):
    stub = coordinator_stub(coordinator[0])
    schema = json.loads(stub.GetConfigSchema(coordinator_pb2.GetConfigSchemaRequest()).json_schema)
    props = schema["properties"]
    assert props["lr"]["type"] == "number"
    assert props["num_rollout"] == {
        **props["num_rollout"],
        "type": "integer",
        "minimum": 0,  # declared with the setting, which StartRun checks too
        "maximum": 2**31 - 1,
    }
    assert props["lr"]["minimum"] == 0
    assert props["rollout_top_p"] == {**props["rollout_top_p"], "exclusiveMinimum": 0, "maximum": 1}
    assert props["rm_type"]["enum"] == ["", "exact_match", "math", "f1", "remote", "custom", "none"]
    assert "min_lr" in {s for rule in schema["x-rollway-rules"] for s in rule["settings"]}
    assert props["loss_type"]["enum"] == ["sft_loss", "policy_loss"]
    assert props["num_epoch"]["default"] == 1
    assert props["async"]["description"] == "alias of async_mode"
    assert all(p.get("description") for p in props.values())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert not list(validator.iter_errors(sft(tiny_model_dir, demo_data_dir, lr=1e-3)))
    errors = {
        e.path[0] if e.path else e.message
        for e in validator.iter_errors({"lr": "1e-3", "num_rollout": 1e20, "nope": 1})
    }
    assert {"lr", "num_rollout"} <= errors
    assert any("nope" in str(e) for e in errors)


def test_values_of_the_wrong_json_type_are_refused_naming_the_expected_type(
    coordinator, tiny_model_dir, demo_data_dir
):
    """The API converts nothing ("1e-3", "4" and "yes" were silently coerced): typed JSON only."""
    stub = coordinator_stub(coordinator[0])
    config = sft(tiny_model_dir, demo_data_dir, lr="1e-3", rollout_batch_size="4", apply_chat_template="yes")
    code, _, fields = refusal(lambda: start(stub, config))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields == {
        "config.lr": "must be a number (got str '1e-3'; values are not converted)",
        "config.rollout_batch_size": "must be an integer (got str '4'; values are not converted)",
        "config.apply_chat_template": "must be true or false (got str 'yes'; values are not converted)",
    }
    # Integers arrive as JSON numbers (doubles): 8.0 is the integer 8.
    assert (
        stub.ValidateRun(
            coordinator_pb2.ValidateRunRequest(config=to_struct(sft(tiny_model_dir, demo_data_dir)))
        ).num_steps
        == 2
    )
