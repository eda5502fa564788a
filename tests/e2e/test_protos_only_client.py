"""The run API driven by a Python client generated from protos/ alone (no rollway import): schema
fetch, a validate-only call with five errors at once (each a FieldViolation), StartRun, following
the run to its end with the state in the stream, a coordinator restart, and ListRuns/GetRun of
the earlier run from the new coordinator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import ServiceProcess

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "tests" / "e2e" / "python_client" / "run_api_client.py"


def generate_stubs(out: Path) -> Path:
    """coordinator.proto compiled by protoc (grpc_tools) into a flat folder of its own, so the
    generated modules are not under rollway's package path."""
    import grpc_tools

    source = out / "proto"
    source.mkdir(parents=True)
    shutil.copy(REPO / "protos" / "rollway" / "coordinator" / "v1" / "coordinator.proto", source)
    include = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{source}", f"-I{include}",
         f"--python_out={out}", f"--grpc_python_out={out}", str(source / "coordinator.proto")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out


def client(stubs: Path, address: str, *args: str, cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, str(CLIENT), str(stubs), address, *args],
        capture_output=True, text=True, timeout=600, cwd=cwd, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_a_client_from_protos_alone_drives_a_run_across_a_coordinator_restart(
    tmp_path, tiny_model_dir, demo_data_dir
):
    stubs = generate_stubs(tmp_path / "stubs")
    runs_root = tmp_path / "runs"
    config = {
        "hf_checkpoint": str(tiny_model_dir),
        "prompt_data": [f"{demo_data_dir / 'sft.parquet'}@[0:24]"],
        "input_key": "messages",
        "apply_chat_template": True,
        "loss_type": "sft_loss",
        "rollout_batch_size": 8,
        "global_batch_size": 8,
        "num_rollout": 0,  # num_epoch epochs: 1 x 24 rows / 8 = 3 steps, known before the start
        "num_epoch": 1,
        "lr": 0.003,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
    }
    (tmp_path / "run.json").write_text(json.dumps(config))
    args = ["--runs-root", str(runs_root)]
    with ServiceProcess("coordinator", args, tmp_path / "first") as coordinator:
        seen = client(
            stubs, coordinator.address, "before", str(tmp_path / "run.json"), "foreign", cwd=tmp_path
        )
    assert seen["imported_rollway"] == []
    assert seen["schema_lr"]["type"] == "number" and seen["schema_lr"]["description"]
    refused = seen["refused"]
    assert refused["code"] == "INVALID_ARGUMENT"
    assert set(refused["violations"]) == {
        "config.lrr", "config.lr", "config.num_rollout", "config.input_key", "config.apply_chat_template",
    }, refused["message"]  # fmt: skip
    assert all(
        f"{field}: {problem}" in refused["message"] for field, problem in refused["violations"].items()
    )
    assert seen["plan"] == {
        "num_steps": 3,
        "end_of_data": "num_epoch 1 x 24 rows / rollout_batch_size 8 = 3 steps",
    }
    assert seen["started"] == {"num_steps": 3, "state": "RUN_STATE_STARTING"}
    records = seen["records"]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert [r["state"] for r in records] == ["RUN_STATE_RUNNING", "RUN_STATE_RUNNING", "RUN_STATE_SUCCEEDED"]
    final = seen["final"]
    assert (final["state"], final["step"], final["num_steps"]) == ("RUN_STATE_SUCCEEDED", "3", "3")
    assert float(final["last_metrics"]["sft/loss"]) == pytest.approx(records[-1]["loss"])

    with ServiceProcess("coordinator", args, tmp_path / "second") as coordinator:
        later = client(stubs, coordinator.address, "after", "foreign", cwd=tmp_path)
    assert later["imported_rollway"] == []
    assert later["listed"] == ["foreign"]
    got = later["got"]
    assert (got["state"], got["step"], got["num_steps"]) == ("RUN_STATE_SUCCEEDED", "3", "3")
    assert got["run_dir"] == str(runs_root / "foreign")
    assert float(got["last_metrics"]["sft/loss"]) == pytest.approx(records[-1]["loss"])
