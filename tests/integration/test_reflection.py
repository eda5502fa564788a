"""Server reflection: every service describes itself, and a client that knows nothing else can call it."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from support.processes import ServiceProcess, start_together

from rollway.deploy.local_processes import demo_service_args

BUF = Path(sys.executable).parent / "buf"
PROTOS = Path(__file__).resolve().parents[2] / "protos"
SERVICES = [
    ("dataloader", "rollway.dataloader.v1.DataloaderService", "NextBatch"),
    ("rollout", "rollway.rollout.v1.RolloutService", "Generate"),
    ("trainer", "rollway.trainer.v1.TrainerService", "TrainStep"),
    ("coordinator", "rollway.coordinator.v1.CoordinatorService", "StartRun"),
]
# FileDescriptorProto field numbers, for source_code_info paths: service = 6, its method = 2.
SERVICE_FIELD, METHOD_FIELD = 6, 2


@pytest.fixture(scope="module")
def services(tiny_model_dir, demo_data_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reflection")
    args = demo_service_args(tiny_model_dir, demo_data_dir, workdir)
    with ExitStack() as stack:
        yield start_together(stack, {name: ServiceProcess(name, a, workdir) for name, a in args.items()})


@pytest.mark.parametrize(("name", "service", "method"), SERVICES)
def test_reflection_lists_and_describes_each_rollway_service(services, name, service, method):
    with grpc.insecure_channel(services[name].address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        names = set(database.get_services())
        assert {
            service,
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
            "grpc.reflection.v1.ServerReflection",
        } <= names
        descriptor = database.FindFileContainingSymbol(service)
        methods = {m.name for s in descriptor.service for m in s.method}
        assert method in methods


def reflect_v1(address: str, *requests: reflection_pb2.ServerReflectionRequest):
    """A raw grpc.reflection.v1 client. v1's messages are v1alpha's under another package name
    (identical on the wire), so v1alpha's classes encode them; the method path is v1's."""
    with grpc.insecure_channel(address) as channel:
        info = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        return list(info(iter(requests), timeout=30))


def proto_comment_above(proto_file: Path, line_prefix: str) -> str:
    """The `//` comment lines right above the line starting with `line_prefix`, as protoc keeps them."""
    lines = proto_file.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if line.strip().startswith(line_prefix))
    comment = []
    while lines[index - 1].strip().startswith("//"):
        index -= 1
        comment.insert(0, lines[index].strip()[2:])
    return "".join(line + "\n" for line in comment)


@pytest.mark.parametrize(("name", "service", "method"), SERVICES)
def test_reflection_v1_serves_each_service_with_its_proto_comments(services, name, service, method):
    listed, found = reflect_v1(
        services[name].address,
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=service),
    )
    assert {s.name for s in listed.list_services_response.service} >= {
        service,
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in found.file_descriptor_response.file_descriptor_proto
    ]
    file = next(f for f in files if service.rsplit(".", 1)[1] in {s.name for s in f.service})
    assert file.name == f"rollway/{name}/v1/{name}.proto"
    s_index, s_proto = next((i, s) for i, s in enumerate(file.service) if s.name == service.rsplit(".", 1)[1])
    m_index = next(i for i, m in enumerate(s_proto.method) if m.name == method)
    comments = {
        tuple(loc.path): loc.leading_comments
        for loc in file.source_code_info.location
        if loc.leading_comments
    }
    expected = proto_comment_above(PROTOS / file.name, f"rpc {method}(")
    assert expected.strip(), f"{file.name} documents rpc {method}"
    assert comments[(SERVICE_FIELD, s_index, METHOD_FIELD, m_index)] == expected


def test_reflection_answers_an_unknown_symbol_with_not_found(services):
    (reply,) = reflect_v1(
        services["coordinator"].address,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="rollway.nope.v1.Nothing"),
    )
    assert reply.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "rollway.nope.v1.Nothing" in reply.error_response.error_message


@pytest.mark.parametrize(("name", "service", "method"), SERVICES)
def test_reflection_resolves_a_method_symbol_as_grpcurl_describe_asks(services, name, service, method):
    (reply,) = reflect_v1(
        services[name].address,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=f"{service}.{method}"),
    )
    assert not reply.HasField("error_response"), reply.error_response.error_message
    first = descriptor_pb2.FileDescriptorProto.FromString(
        reply.file_descriptor_response.file_descriptor_proto[0]
    )
    declared = {f"{first.package}.{s.name}": [m.name for m in s.method] for s in first.service}
    assert method in declared[service]
    (missing,) = reflect_v1(
        services[name].address,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=f"{service}.NoSuchMethod"),
    )
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_health_list_answers_every_service_status(services):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    for name, service, _ in SERVICES:
        with grpc.insecure_channel(services[name].address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=10)
        assert reply.statuses[service].status == health_pb2.HealthCheckResponse.SERVING
        assert reply.statuses[""].status == health_pb2.HealthCheckResponse.SERVING


def _buf() -> str:
    if BUF.exists():
        return str(BUF)
    if shutil.which("buf") is None:
        pytest.skip("buf not installed")
    return shutil.which("buf")


def buf_curl(address: str, path: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_buf(), "curl", "--protocol", "grpc", "--http2-prior-knowledge", *flags, f"http://{address}/{path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("protocol", ["grpc-v1", "grpc-v1alpha"])
def test_buf_curl_calls_health_check_through_reflection_only(services, protocol):
    for svc in services.values():
        result = buf_curl(
            svc.address, "grpc.health.v1.Health/Check", "--reflect-protocol", protocol, "--data", "{}"
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"status": "SERVING"}


def test_buf_curl_calls_rollway_rpcs_through_reflection_v1(services):
    listed = buf_curl(services["coordinator"].address, "", "--reflect-protocol", "grpc-v1", "--list-methods")
    assert listed.returncode == 0, listed.stderr
    assert "rollway.coordinator.v1.CoordinatorService/StartRun" in listed.stdout.split()
    runs = buf_curl(
        services["coordinator"].address,
        "rollway.coordinator.v1.CoordinatorService/ListRuns",
        "--reflect-protocol",
        "grpc-v1",
        "--data",
        "{}",
    )
    assert runs.returncode == 0, runs.stderr
    assert json.loads(runs.stdout) == {}
    described = buf_curl(
        services["dataloader"].address,
        "rollway.dataloader.v1.DataloaderService/Describe",
        "--reflect-protocol",
        "grpc-v1",
        "--data",
        "{}",
    )
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout)["mode"] == "rl"


def test_reflection_serves_the_error_detail_types_a_refused_request_carries(services):
    """#38: a bad StartRun's details are a google.rpc.BadRequest, and reflection did not serve the
    google.rpc types, so a client knowing nothing else could not decode them. Reflection now
    describes them; buf curl (which prints details in Connect's JSON, type and base64 value,
    whatever reflection serves) shows the type, and its value decodes to the field violations."""
    from google.rpc import error_details_pb2

    address = services["coordinator"].address
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        for symbol in ("google.rpc.BadRequest", "google.rpc.PreconditionFailure", "google.rpc.Status"):
            described = database.FindFileContainingSymbol(symbol)
            assert symbol.rsplit(".", 1)[1] in {m.name for m in described.message_type}, symbol
    refused = buf_curl(
        address,
        "rollway.coordinator.v1.CoordinatorService/StartRun",
        "--reflect-protocol",
        "grpc-v1",
        "--data",
        json.dumps({"run_id": "bad-settings", "config": {"global_batch_size": -4}}),
    )
    assert refused.returncode != 0
    error = json.loads(refused.stderr)
    assert error["code"] == "invalid_argument"
    (detail,) = error["details"]
    assert detail["type"] == "google.rpc.BadRequest"
    padded = detail["value"] + "=" * (-len(detail["value"]) % 4)
    violations = error_details_pb2.BadRequest.FromString(base64.b64decode(padded)).field_violations
    assert "config.global_batch_size" in [v.field for v in violations], violations
