"""Fail fast and say why: a service that dies starting, an address nobody answers at, a held port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import ServiceProcess

from rollway.common.client import UnreachableError, wait_until_serving
from rollway.common.supervision.service_process import ServiceExitedError

TESTS_DIR = str(Path(__file__).resolve().parents[1])


def test_a_service_that_exits_during_start_up_is_reported_at_once_with_its_log(tiny_model_dir, tmp_path):
    model = tmp_path / "truncated-model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    trainer = ServiceProcess(
        "trainer", ["--hf-checkpoint", str(model)], tmp_path / "logs", startup_timeout=120
    )
    started = time.monotonic()
    with pytest.raises(ServiceExitedError) as exited:
        trainer.start()
    elapsed = time.monotonic() - started
    message = str(exited.value)
    assert message.startswith(f"trainer (pid {trainer.pid}) exited with 1 during start-up; last log lines:")
    assert "SafetensorError" in message  # the cause, from the service's own log
    # The trainer binds its port before loading, so it used to be waited on until startup_timeout.
    assert elapsed < 60, f"reported after {elapsed:.1f}s"
    print(f"truncated model reported {elapsed:.2f}s after start")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_waiting_on_an_address_that_refuses_connections_fails_in_seconds_naming_it():
    address = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(UnreachableError) as unreachable:
        wait_until_serving(address, timeout_seconds=120, unreachable_seconds=3)
    assert time.monotonic() - started < 20
    assert str(unreachable.value).startswith(f"{address} is unreachable: nothing answered there for 3s")
    assert "Connection refused" in str(unreachable.value)


def test_rollway_run_attached_to_a_refusing_trainer_fails_in_seconds_naming_it(
    tmp_path, tiny_model_dir, demo_data_dir
):
    env = {"PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # A stand-in that answers health SERVING for the dataloader and rollout addresses: the run
    # gets as far as the trainer, which nothing answers for.
    with ServiceProcess("probe", [], tmp_path / "probe", module="support.probe_service", env=env) as probe:
        trainer = f"127.0.0.1:{_closed_port()}"
        config = tmp_path / "run.yaml"
        config.write_text(
            f"hf_checkpoint: {tiny_model_dir}\nprompt_data: [{demo_data_dir / 'rl.parquet'}]\nnum_rollout: 1\n"
            "rollout_batch_size: 2\nn_samples_per_prompt: 2\nglobal_batch_size: 4\n"
            f"run_dir: {tmp_path / 'runs'}\nrun_id: attach\n"
        )
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "rollway.cli", "run", str(config), "--trainer-addr", trainer]
            + ["--dataloader-addr", probe.address, "--rollout-addr", probe.address],
            capture_output=True,
            text=True,
            timeout=120,
        )
        elapsed = time.monotonic() - started
    # StartRun checks the attached services' health before it registers the run: refused at once
    # (FAILED_PRECONDITION naming the setting), not a run that fails seconds later.
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"run refused: config.trainer_addr: {trainer}: the trainer does not answer" in result.stderr, (
        result.stdout + result.stderr
    )
    assert not (tmp_path / "runs" / "attach" / "config.json").exists()
    assert elapsed < 60, f"failed after {elapsed:.1f}s"
    print(f"rollway run --trainer-addr {trainer} failed after {elapsed:.1f}s")


def test_a_second_service_on_a_port_a_service_holds_is_refused_naming_the_port(tmp_path):
    runs = ["--runs-root", str(tmp_path / "runs")]
    with ServiceProcess("coordinator", runs, tmp_path / "first") as first:
        second = ServiceProcess("coordinator", [*runs, "--port", str(first.port)], tmp_path / "second")
        with pytest.raises(ServiceExitedError) as refused:
            second.start()
        message = str(refused.value)
        assert f"could not bind 127.0.0.1:{first.port}: port {first.port} is already in use" in message
        assert "Traceback" not in message  # one clear line, not a Python stack
        assert second.proc.returncode == 2  # a usage error
        assert first.proc.poll() is None  # the first service holds the port, alone, and serves
        with grpc.insecure_channel(first.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
