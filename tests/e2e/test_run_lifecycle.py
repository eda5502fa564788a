"""Long-lived services: run after run on the same services, a coordinator that starts its own,
one flat run config for StartRun, agreement checks, and a run API that tells the truth."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import ServiceProcess, descendants
from support.stack import coordinator_stub, start_run, wait_run

from rollway.common.client import open_channel
from rollway.coordinator.v1 import coordinator_pb2
from rollway.coordinator.watch import DEAD_GRACE_SECONDS

pytestmark = pytest.mark.slow


def grpo_config(model: Path, data: Path, **overrides) -> dict:
    return {
        "hf_checkpoint": str(model),
        "prompt_data": [str(data / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "global_batch_size": 16,
        "num_rollout": 2,
        "rollout_max_response_len": 6,
        "lr": 1e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        **overrides,
    }


def sft_config(model: Path, data: Path, **overrides) -> dict:
    return {
        "hf_checkpoint": str(model),
        "prompt_data": [str(data / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "loss_type": "sft_loss",
        "rollout_batch_size": 8,
        "global_batch_size": 8,
        "num_rollout": 3,
        "lr": 3e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        **overrides,
    }


def losses(run_dir: str, key: str) -> list[float]:
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in records if key in r]


def serving(address: str) -> bool:
    with open_channel(address) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2.0)
            return True
        except grpc.RpcError:
            return False


@pytest.fixture(scope="module")
def bare_services(tmp_path_factory):
    """A bare dataloader, trainer and rollout service (no flags) and a coordinator."""
    workdir = tmp_path_factory.mktemp("bare")
    with ExitStack() as stack:
        started = {
            name: stack.enter_context(ServiceProcess(name, [], workdir))
            for name in ("dataloader", "trainer", "rollout")
        }
        started["coordinator"] = stack.enter_context(
            ServiceProcess("coordinator", ["--runs-root", str(workdir / "runs")], workdir)
        )
        yield started


def attached(services: dict) -> dict:
    return {
        "dataloader_addr": services["dataloader"].address,
        "trainer_addr": services["trainer"].address,
        "rollout_addr": [services["rollout"].address],
    }


def test_runs_back_to_back_on_the_same_services_equal_runs_on_fresh_ones(
    bare_services, tiny_model_dir, demo_data_dir, tmp_path
):
    """Run A on fresh (bare) services, then B on the same services with the same config: B must
    repeat A bit for bit (rewards, losses, final weights). An SFT run between them leaves no trace."""
    stub = coordinator_stub(bare_services["coordinator"])
    config = {**grpo_config(tiny_model_dir, demo_data_dir), **attached(bare_services)}
    first = start_run(stub, "grpo-a", {**config, "save_hf": str(tmp_path / "hf-a")})
    first = wait_run(stub, "grpo-a")
    assert first.state == coordinator_pb2.RUN_STATE_SUCCEEDED, first.error
    between = start_run(
        stub, "sft-between", {**sft_config(tiny_model_dir, demo_data_dir), **attached(bare_services)}
    )
    between = wait_run(stub, "sft-between")
    assert between.state == coordinator_pb2.RUN_STATE_SUCCEEDED, between.error
    second = start_run(stub, "grpo-b", {**config, "save_hf": str(tmp_path / "hf-b")})
    second = wait_run(stub, "grpo-b")
    assert second.state == coordinator_pb2.RUN_STATE_SUCCEEDED, second.error

    for key in ("rollout/raw_reward", "train/pg_loss", "train/grad_norm", "rollout/response_len/mean"):
        assert losses(first.run_dir, key) == losses(second.run_dir, key), key
    assert len(losses(first.run_dir, "train/grad_norm")) == 2
    assert (first.step, second.step) == (2, 2)
    weights_a = (Path(first.hf_export_dir) / "model.safetensors").read_bytes()
    weights_b = (Path(second.hf_export_dir) / "model.safetensors").read_bytes()
    assert weights_a == weights_b
    assert losses(between.run_dir, "sft/loss")[0] > losses(between.run_dir, "sft/loss")[-1]


def test_a_service_held_by_a_run_refuses_another_naming_it(bare_services, tiny_model_dir, demo_data_dir):
    stub = coordinator_stub(bare_services["coordinator"])
    config = {**sft_config(tiny_model_dir, demo_data_dir, num_rollout=10_000), **attached(bare_services)}
    config.pop("rollout_addr")
    start_run(stub, "holder", config)
    deadline = time.monotonic() + 120
    while stub.GetRun(coordinator_pb2.GetRunRequest(run_id="holder")).run.step < 1:
        assert time.monotonic() < deadline, "the holding run never took a step"
        time.sleep(0.1)
    start_run(stub, "second", config)
    second = wait_run(stub, "second")
    assert second.state == coordinator_pb2.RUN_STATE_FAILED
    assert "serves run 'holder'" in second.error and "trainer" in second.error
    asked = time.time()
    stopped = stub.StopRun(coordinator_pb2.StopRunRequest(run_id="holder", immediate=True)).run
    holder = wait_run(stub, "holder", timeout=60)
    assert holder.state == coordinator_pb2.RUN_STATE_STOPPED
    # The cancelled step is no failure to wait on: the run ends without the death grace (#38).
    assert holder.finished_time - asked < DEAD_GRACE_SECONDS, "an immediate stop waited for a dead service"
    assert stopped.run_id == "holder"
    # The holder ended: the next run takes the services.
    again = wait_run(stub, start_run(stub, "after-holder", {**config, "num_rollout": 1}).run_id)
    assert again.state == coordinator_pb2.RUN_STATE_SUCCEEDED, again.error


def test_start_run_reports_every_config_error_at_once(bare_services):
    stub = coordinator_stub(bare_services["coordinator"])
    with pytest.raises(grpc.RpcError) as refused:
        start_run(
            stub, "bad", {"lr": "fast", "rollout_batch_size": "many", "learning_rate": 1, "loss_type": "x"}
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for part in (
        "config.lr: must be a number",
        "config.rollout_batch_size: must be an integer",
        "config.learning_rate: unknown setting",
        "config.loss_type: must be one of",
    ):
        assert part in refused.value.details()
    for run_id in ("../../escape", "a/b", ".hidden"):
        with pytest.raises(grpc.RpcError) as escaped:
            start_run(stub, run_id, {"hf_checkpoint": "x"})
        assert (
            escaped.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "run_id" in escaped.value.details()
        )


def test_attached_services_that_disagree_refuse_the_run_naming_both_values(
    tmp_path, tiny_model_dir, demo_data_dir
):
    from rollway.demo.tiny_model import make_tiny_model

    other_model = make_tiny_model(tmp_path / "other-model", seed=1)
    data_flags = [
        "--prompt-data",
        str(demo_data_dir / "rl.parquet"),
        "--input-key",
        "prompt",
        "--apply-chat-template",
    ]
    with ExitStack() as stack:

        def start(name: str, *flags: str) -> ServiceProcess:
            return stack.enter_context(ServiceProcess(name, list(flags), tmp_path))

        model = str(tiny_model_dir)
        trainer = start("trainer", "--hf-checkpoint", model, "--rollout-temperature", "0.7")
        rollout = start("rollout", "--hf-checkpoint", model)
        other_rollout = start("rollout", "--hf-checkpoint", str(other_model))
        dataloader = start("dataloader", "--hf-checkpoint", model, *data_flags)
        stub = coordinator_stub(start("coordinator", "--runs-root", str(tmp_path / "runs")))
        config = {
            key: value
            for key, value in grpo_config(tiny_model_dir, demo_data_dir).items()
            if key not in ("hf_checkpoint", "prompt_data", "input_key", "label_key", "apply_chat_template")
        }
        config.update(trainer_addr=trainer.address, dataloader_addr=dataloader.address)

        # The run names no temperature: it samples at 1.0 while the trainer divides logits by 0.7.
        run = wait_run(
            stub, start_run(stub, "temperature", {**config, "rollout_addr": [rollout.address]}).run_id
        )
        assert run.state == coordinator_pb2.RUN_STATE_FAILED
        assert "rollout_temperature: the run has 1.0, the trainer has 0.7" in run.error
        # Naming it settles it; a rollout service serving another model is then refused.
        config["rollout_temperature"] = 0.7
        run = wait_run(
            stub, start_run(stub, "model", {**config, "rollout_addr": [other_rollout.address]}).run_id
        )
        assert run.state == coordinator_pb2.RUN_STATE_FAILED
        assert f"hf_checkpoint: trainer has {model!r}, rollout_0 has {str(other_model)!r}" in run.error
        # Refused runs hold nothing: the agreeing services take the next run at once.
        run = wait_run(stub, start_run(stub, "agreed", {**config, "rollout_addr": [rollout.address]}).run_id)
        assert run.state == coordinator_pb2.RUN_STATE_SUCCEEDED, run.error


def test_a_coordinator_starts_its_own_services_and_tells_the_truth(tmp_path, tiny_model_dir, demo_data_dir):
    with ServiceProcess("coordinator", ["--runs-root", str(tmp_path / "runs")], tmp_path) as coordinator:
        stub = coordinator_stub(coordinator)
        # Refused before anything starts: a model path that is no model, and a response as long
        # as the tiny model's context (max_position_embeddings 1024 in its config.json).
        for run_id, bad, named in (
            (
                "no-model",
                sft_config(tmp_path, demo_data_dir),
                f"config.hf_checkpoint: {tmp_path} is not a Hugging Face model directory (no config.json)",
            ),
            (
                "too-long",
                grpo_config(tiny_model_dir, demo_data_dir, rollout_max_response_len=1024),
                "config.rollout_max_response_len: 1024 leaves no room for a prompt",
            ),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                start_run(stub, run_id, bad)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith(named), refused.value.details()
            assert not descendants(coordinator.pid) and not (tmp_path / "runs" / run_id).exists()
        config = sft_config(
            tiny_model_dir, demo_data_dir, save=str(tmp_path / "ckpt"), save_hf=str(tmp_path / "hf")
        )
        info = wait_run(stub, start_run(stub, "own", config).run_id)
        assert info.state == coordinator_pb2.RUN_STATE_SUCCEEDED, info.error
        assert (info.step, info.num_steps) == (3, 3)
        assert "sft/loss" in info.last_metrics and "sft/tokens_seen" in info.last_metrics
        assert Path(info.checkpoint_dir, "coordinator.json").exists()
        assert Path(info.hf_export_dir, "config.json").exists()
        assert sorted(info.service_addresses) == ["dataloader", "trainer"]
        # The services it started for the run are gone once the run ended.
        for address in info.service_addresses.values():
            assert not serving(address)
