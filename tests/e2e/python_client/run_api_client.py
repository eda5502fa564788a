"""A coordinator client built from protos/ alone: its stubs are generated into a folder of its own
(not rollway's package path) and it imports no rollway module. What a team wiring rollway into
its own platform writes first.

    python run_api_client.py STUBS_DIR ADDRESS before CONFIG_JSON RUN_ID   schema, validate, start, follow
    python run_api_client.py STUBS_DIR ADDRESS after RUN_ID                list and get an earlier run

Prints one JSON object with what it saw; exits non-zero on anything unexpected.
"""

from __future__ import annotations

import json
import sys

import grpc
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

sys.path.insert(0, sys.argv[1])
import coordinator_pb2  # noqa: E402 (generated into STUBS_DIR)
import coordinator_pb2_grpc  # noqa: E402


def struct(mapping: dict) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(mapping)
    return value


def violations(error: grpc.RpcError) -> dict[str, str]:
    status = rpc_status.from_call(error)
    found = {}
    for detail in status.details if status else []:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            found.update({v.field: v.description for v in bad.field_violations})
    return found


def before(stub, config: dict, run_id: str) -> dict:
    schema = json.loads(stub.GetConfigSchema(coordinator_pb2.GetConfigSchemaRequest()).json_schema)
    # Five mistakes at once, as a form would send them.
    broken = {**config, "lrr": 1e-3, "lr": "1e-3", "num_rollout": 1e20, "input_key": "no_such_column",
              "apply_chat_template": "yes"}  # fmt: skip
    try:
        stub.ValidateRun(coordinator_pb2.ValidateRunRequest(config=struct(broken)))
        raise SystemExit("ValidateRun accepted a broken config")
    except grpc.RpcError as error:
        refused = {"code": error.code().name, "message": error.details(), "violations": violations(error)}
    plan = stub.ValidateRun(coordinator_pb2.ValidateRunRequest(config=struct(config)))
    started = stub.StartRun(coordinator_pb2.StartRunRequest(config=struct(config), run_id=run_id)).run
    stream = stub.StreamMetrics(coordinator_pb2.StreamMetricsRequest(run_id=run_id), timeout=600)
    records = [
        {"step": r.step, "state": coordinator_pb2.RunState.Name(r.state), "loss": r.metrics["sft/loss"]}
        for r in stream
    ]
    final = stub.GetRun(coordinator_pb2.GetRunRequest(run_id=run_id)).run
    return {
        "schema_lr": schema["properties"]["lr"],
        "refused": refused,
        "plan": {"num_steps": plan.num_steps, "end_of_data": plan.end_of_data},
        "started": {"num_steps": started.num_steps, "state": coordinator_pb2.RunState.Name(started.state)},
        "records": records,
        "final": json_format.MessageToDict(final, preserving_proto_field_name=True),
    }


def after(stub, run_id: str) -> dict:
    listed = stub.ListRuns(coordinator_pb2.ListRunsRequest()).runs
    got = stub.GetRun(coordinator_pb2.GetRunRequest(run_id=run_id)).run
    return {
        "listed": [r.run_id for r in listed],
        "got": json_format.MessageToDict(got, preserving_proto_field_name=True),
    }


def main() -> None:
    address, phase = sys.argv[2], sys.argv[3]
    with grpc.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        if phase == "before":
            out = before(stub, json.loads(open(sys.argv[4]).read()), sys.argv[5])
        else:
            out = after(stub, sys.argv[4])
    out["imported_rollway"] = sorted(m for m in sys.modules if m == "rollway" or m.startswith("rollway."))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
