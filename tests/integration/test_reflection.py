"""Server reflection: every service describes itself, and a client that knows nothing else can call it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from support.processes import ServiceProcess

from rollway.common.local_launch import demo_service_args

BUF = Path(sys.executable).parent / "buf"


@pytest.fixture(scope="module")
def services(tiny_model_dir, demo_data_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reflection")
    started = []
    try:
        for name, args in demo_service_args(tiny_model_dir, demo_data_dir, workdir).items():
            started.append(ServiceProcess(name, args, workdir).start())
        yield {svc.service: svc for svc in started}
    finally:
        for svc in reversed(started):
            svc.stop()


@pytest.mark.parametrize(
    ("name", "service", "method"),
    [
        ("dataloader", "rollway.dataloader.v1.DataloaderService", "NextBatch"),
        ("rollout", "rollway.rollout.v1.RolloutService", "Generate"),
        ("trainer", "rollway.trainer.v1.TrainerService", "TrainStep"),
        ("coordinator", "rollway.coordinator.v1.CoordinatorService", "StartRun"),
    ],
)
def test_reflection_lists_and_describes_each_rollway_service(services, name, service, method):
    with grpc.insecure_channel(services[name].address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        names = set(database.get_services())
        assert {service, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
        descriptor = database.FindFileContainingSymbol(service)
        methods = {m.name for s in descriptor.service for m in s.method}
        assert method in methods


def test_buf_curl_calls_health_check_through_reflection_only(services):
    if not BUF.exists() and shutil.which("buf") is None:
        pytest.skip("buf not installed")
    buf = str(BUF) if BUF.exists() else shutil.which("buf")
    for svc in services.values():
        result = subprocess.run(
            [
                buf,
                "curl",
                "--protocol",
                "grpc",
                "--http2-prior-knowledge",
                "--data",
                "{}",
                f"http://{svc.address}/grpc.health.v1.Health/Check",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"status": "SERVING"}
