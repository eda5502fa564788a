"""Packaging: every package under services/ is listed, and light services import without torch."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_every_package_under_services_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(["rollway", *p.parent.relative_to(ROOT / "services").parts])
        for p in (ROOT / "services").rglob("__init__.py")
    }
    assert found == listed


def test_generated_proto_code_is_fresh():
    result = subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_coordinator_and_dataloader_grpc_layers_import_without_torch():
    code = (
        "import sys, rollway.coordinator.service, rollway.common.client, rollway.common.server;"
        "import rollway.dataloader.v1.dataloader_pb2_grpc;"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
