"""Services started on their own (containers, Ray actors) from one flat run config (--run-config),
and the grpc.health.v1 check that container health checks run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from support.processes import ServiceProcess

from rollway.common.client import open_channel
from rollway.common.config import parse_components
from rollway.common.server import ServerConfig
from rollway.common.service_main import run_config_keys
from rollway.coordinator.config import CoordinatorConfig
from rollway.dataloader.config import DataloaderConfig
from rollway.dataloader.v1 import dataloader_pb2, dataloader_pb2_grpc
from rollway.rollout.config import RolloutConfig
from rollway.trainer.config import TrainerConfig


def run_config(model_dir, data_dir, **extra) -> dict:
    """A whole run's flat config: keys of the coordinator, trainer, rollout and dataloader together."""
    return {
        "hf_checkpoint": str(model_dir),
        "prompt_data": [str(data_dir / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "loss_type": "policy_loss",
        "num_rollout": 3,  # coordinator
        "rollout_batch_size": 8,  # coordinator
        "trainer_addr": "trainer:50051",  # coordinator
        "lr": 1e-4,  # trainer
        "world_size": 2,  # trainer
        "reward": "none",  # rollout
        "rollout_max_response_len": 7,  # rollout and coordinator
        "async": True,  # coordinator, by its alias
        **extra,
    }


def write(path, mapping: dict):
    path.write_text(yaml.safe_dump(mapping))
    return path


def serve_argv(service: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"rollway.{service}", *args], capture_output=True, text=True, timeout=60
    )


def test_a_service_takes_its_own_keys_from_a_whole_run_config(tiny_model_dir, demo_data_dir, tmp_path):
    """The compose services start like this (the trainer and rollout ones in test_deploy_compose)."""
    path = write(tmp_path / "run.yaml", run_config(tiny_model_dir, demo_data_dir))
    with ServiceProcess("dataloader", ["--run-config", str(path)], tmp_path) as dataloader:
        described = dataloader_pb2_grpc.DataloaderServiceStub(open_channel(dataloader.address)).Describe(
            dataloader_pb2.DescribeRequest()
        )
        check = serve_argv("common.healthcheck", dataloader.address)  # what the compose health checks run
        assert (check.returncode, check.stdout.strip()) == (0, f"{dataloader.address}: SERVING")
        unknown = serve_argv("common.healthcheck", dataloader.address, "--service", "rollway.nope.v1.Nope")
        assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stdout
    assert described.mode == "rl" and described.config["input_key"] == "prompt"
    assert described.config["label_key"] == "label" and described.sources[0].path.endswith("rl.parquet")
    gone = serve_argv("common.healthcheck", dataloader.address, "--timeout", "1")
    assert gone.returncode == 1 and "UNAVAILABLE" in gone.stdout


def test_config_and_flags_override_the_run_config(tmp_path, tiny_model_dir, demo_data_dir):
    base = write(tmp_path / "run.yaml", run_config(tiny_model_dir, demo_data_dir, lr=0.5, seed=7))
    own = write(tmp_path / "trainer.yaml", {"lr": 0.25})
    keys = run_config_keys
    server, trainer = parse_components(
        [ServerConfig, TrainerConfig], ["--run-config", str(base)], run_config_keys=keys
    )
    assert (trainer.lr, trainer.seed, trainer.world_size, server.port) == (0.5, 7, 2, 0)
    _, trainer = parse_components(
        [ServerConfig, TrainerConfig],
        ["--run-config", str(base), "--config", str(own), "--seed", "9"],
        run_config_keys=keys,
    )
    assert (trainer.lr, trainer.seed) == (0.25, 9)
    (dataloader,) = parse_components([DataloaderConfig], ["--run-config", str(base)], run_config_keys=keys)
    assert dataloader.input_key == "prompt" and dataloader.prompt_data == [str(demo_data_dir / "rl.parquet")]
    (rollout,) = parse_components([RolloutConfig], ["--run-config", str(base)], run_config_keys=keys)
    assert (rollout.reward, rollout.rollout_max_response_len) == ("none", 7)
    (coordinator,) = parse_components([CoordinatorConfig], ["--run-config", str(base)], run_config_keys=keys)
    assert (coordinator.async_mode, coordinator.trainer_addr, coordinator.weight_master_address) == (
        True,
        "trainer:50051",
        "trainer",  # the weight group meets at the trainer's host unless update_weight_master_addr says
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # a key that no component of a run declares: still an error, with a suggestion
        (["--run-config", "{bad_key}"], "rollout_max_respons_len: unknown setting in run config"),
        # a process setting does not belong in a run config (every service would get the same port)
        (["--run-config", "{port}"], "port: unknown setting in run config"),
        # --config stays strict: another component's key is an error there
        (["--config", "{other}"], "lr: unknown setting"),
    ],
)
def test_bad_run_config_keys_are_refused_naming_them(tmp_path, tiny_model_dir, demo_data_dir, args, message):
    files = {
        "bad_key": write(tmp_path / "bad.yaml", {"rollout_max_respons_len": 4}),
        "port": write(tmp_path / "port.yaml", run_config(tiny_model_dir, demo_data_dir, port=50051)),
        "other": write(tmp_path / "other.yaml", {"prompt_data": ["x.parquet"], "lr": 0.1}),
    }
    result = serve_argv("dataloader", *[a.format(**files) for a in args])
    assert result.returncode == 2
    assert message in result.stderr
    if "respons_len" in message:
        assert "did you mean rollout_max_response_len?" in result.stderr
