"""`rollway run --launcher ray` on a local Ray cluster (CPU only, shared by the tests of this module).

Two trainer ranks are two actors forming one torch.distributed group, one rollout actor, a
dataloader and a coordinator actor; gRPC and weight sync are the same as in a local run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
import yaml

from rollway.common.client import ClientConfig, open_channel
from rollway.dataloader.v1 import dataloader_pb2, dataloader_pb2_grpc
from rollway.launcher import run

ray = pytest.importorskip("ray")

REWARD_MODULE = '''
def odd_index(sample):
    """Half of every group scores 1: every group has reward variance, so GRPO has a gradient."""
    return float(sample.index % 2)
'''


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray cluster with 8 logical CPUs; its workers can import the test's reward module."""
    reward_dir = tmp_path_factory.mktemp("reward")
    (reward_dir / "ray_test_reward.py").write_text(REWARD_MODULE)
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(reward_dir), previous]))
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        if previous is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = previous


def write_config(path: Path, **settings) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


def sft_config(tmp_path: Path, model_dir: Path, data_dir: Path, run_id: str, **extra) -> Path:
    return write_config(
        tmp_path / f"{run_id}.yaml",
        run_id=run_id,
        run_dir=str(tmp_path / "runs"),
        hf_checkpoint=str(model_dir),
        loss_type="sft_loss",
        prompt_data=[str(data_dir / "sft.parquet")],
        input_key="messages",
        apply_chat_template=True,
        num_rollout=4,
        rollout_batch_size=16,
        global_batch_size=16,
        lr=3e-3,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=4096,
        **extra,
    )


def rl_config(tmp_path: Path, model_dir: Path, data_dir: Path, run_id: str, **extra) -> Path:
    return write_config(
        tmp_path / f"{run_id}.yaml",
        run_id=run_id,
        run_dir=str(tmp_path / "runs"),
        hf_checkpoint=str(model_dir),
        prompt_data=[str(data_dir / "rl.parquet")],
        input_key="prompt",
        label_key="label",
        apply_chat_template=True,
        rollout_batch_size=4,
        n_samples_per_prompt=4,
        global_batch_size=16,
        rollout_max_response_len=6,
        **extra,
    )


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def pids(output: str) -> dict[str, int]:
    """The launcher's `  <actor>  <address or rank>  pid N` lines."""
    return {m[0]: int(m[1]) for m in re.findall(r"^  (\S+)\s+.*\bpid (\d+)$", output, re.MULTILINE)}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


@pytest.mark.slow
def test_sft_with_two_trainer_rank_actors_matches_a_local_single_rank_run(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path
):
    ray_config = sft_config(tmp_path, tiny_model_dir, demo_data_dir, "sft-ray", world_size=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "rollway.cli", "run", str(ray_config), "--launcher", "ray"]
    result = subprocess.run(
        [*command, "--ray-address", ray_cluster], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "run sft-ray SUCCEEDED" in result.stdout
    started = pids(result.stdout)
    assert set(started) == {"trainer-0", "trainer-1", "dataloader", "coordinator"}  # no rollout for SFT
    assert not any(alive(pid) for pid in started.values())
    rank1_log = (tmp_path / "runs" / "sft-ray" / "services" / "trainer-1" / "process.log").read_text()
    assert '"rank": 1' in rank1_log and "rank ready" in rank1_log

    local_config = sft_config(tmp_path, tiny_model_dir, demo_data_dir, "sft-local", world_size=1)
    assert run([str(local_config)]) == 0
    on_ray = [r["sft/loss"] for r in read_metrics(tmp_path / "runs" / "sft-ray")]
    local = [r["sft/loss"] for r in read_metrics(tmp_path / "runs" / "sft-local")]
    assert len(on_ray) == 4 and on_ray[-1] < on_ray[0]
    assert on_ray == pytest.approx(local, rel=1e-4)  # 2 FSDP ranks on 2 actors == 1 rank


@pytest.mark.slow
def test_grpo_on_ray_syncs_weights_from_the_trainer_actors_to_the_rollout_actor(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path, capfd
):
    config = rl_config(
        tmp_path,
        tiny_model_dir,
        demo_data_dir,
        "grpo-ray",
        loss_type="policy_loss",
        advantage_estimator="grpo",
        num_rollout=2,
        world_size=2,
        custom_rm_path="ray_test_reward:odd_index",
        rm_type="custom",
        lr=1e-3,
        check_weight_update_equal=True,  # scramble the engine, sync, compare checksums (else the run fails)
    )
    assert run([str(config), "--launcher", "ray"]) == 0
    output = capfd.readouterr().out
    assert "run grpo-ray SUCCEEDED" in output
    assert set(pids(output)) == {"trainer-0", "trainer-1", "rollout-0", "dataloader", "coordinator"}
    steps = [r for r in read_metrics(tmp_path / "runs" / "grpo-ray") if "train/loss" in r]
    assert len(steps) == 2
    versions = [r["rollout/weight_version"] for r in steps]
    assert versions[1] == versions[0] + 1 and all(r["perf/weight_sync_time"] > 0 for r in steps)
    assert [r["rollout/raw_reward"] for r in steps] == [0.5, 0.5]
    assert all(r["train/grad_norm"] > 0 for r in steps)
    # The engine generated with the weights the trainer ranks hold: same log-probs up to noise.
    assert all(r["train/train_rollout_logprob_abs_diff"] < 1e-3 for r in steps)
    config_sent = json.loads((tmp_path / "runs" / "grpo-ray" / "config.json").read_text())
    trainer_host = config_sent["trainer_addr"].rsplit(":", 1)[0]
    assert (
        config_sent["update_weight_master_port"] > 0
        and trainer_host == config_sent["rollout_addr"][0].rsplit(":", 1)[0]
    )


def describe_status(address: str, token: str) -> grpc.StatusCode:
    stub = dataloader_pb2_grpc.DataloaderServiceStub(open_channel(address, ClientConfig(auth_token=token)))
    try:
        stub.Describe(dataloader_pb2.DescribeRequest())
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.slow
def test_a_dead_rollout_actor_is_reported_and_everything_is_stopped(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path, capfd, monkeypatch
):
    config = rl_config(
        tmp_path, tiny_model_dir, demo_data_dir, "dies", debug_rollout_only=True, num_rollout=100000
    )
    monkeypatch.setenv("ROLLWAY_AUTH_TOKEN", "ray-token")  # forwarded to the actors' services
    metrics = tmp_path / "runs" / "dies" / "metrics.jsonl"
    statuses = {}

    def kill_rollout_after_first_step():
        deadline = time.monotonic() + 240
        while not (metrics.exists() and metrics.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        dataloader = json.loads((metrics.parent / "config.json").read_text())["dataloader_addr"]
        statuses.update(
            no_token=describe_status(dataloader, "wrong"), token=describe_status(dataloader, "ray-token")
        )
        ray.kill(ray.get_actor("rollway-dies-rollout-0"))

    killer = threading.Thread(target=kill_rollout_after_first_step, daemon=True)
    killer.start()
    assert run([str(config), "--launcher", "ray"]) == 1
    killer.join(5)
    out, err = capfd.readouterr()
    assert re.search(r"rollout-0 \(Ray actor on node [\d.]+\) died; its service is gone", err), err
    assert "run dies SUCCEEDED" not in out
    started = pids(out)
    assert set(started) == {"rollout-0", "dataloader", "coordinator"}  # debug_rollout_only: no trainer
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in started.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, pid in started.items() if alive(pid)]  # the rollout one died with its actor
    assert not [a for a in ray.util.list_named_actors() if a.startswith("rollway-dies-")]
    assert statuses == {"no_token": grpc.StatusCode.UNAUTHENTICATED, "token": grpc.StatusCode.OK}


def test_runs_that_do_not_fit_the_cluster_are_refused_before_anything_starts(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path, capfd
):
    sglang = rl_config(tmp_path, tiny_model_dir, demo_data_dir, "sglang", rollout_engine="sglang")
    assert run([str(sglang), "--launcher", "ray"]) == 2
    assert "cannot place the run on Ray: rollout_engine sglang needs GPUs" in capfd.readouterr().err
    too_big = sft_config(tmp_path, tiny_model_dir, demo_data_dir, "big", world_size=9)
    assert run([str(too_big), "--launcher", "ray"]) == 2
    err = capfd.readouterr().err
    assert "the run's actors need 11 CPU in total and the Ray cluster has 8" in err
    assert not (tmp_path / "runs" / "big").exists()


def test_a_service_that_cannot_start_is_reported_with_its_log(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path, capfd
):
    config = sft_config(tmp_path, tmp_path / "no-model", demo_data_dir, "no-model")
    assert run([str(config), "--launcher", "ray"]) == 1
    err = capfd.readouterr().err
    assert re.search(
        r"run no-model could not start on Ray: (trainer-0|dataloader) exited with 2 before serving", err
    )
    assert "hf_checkpoint" in err and "ray::" not in err
    assert not [a for a in ray.util.list_named_actors() if a.startswith("rollway-no-model-")]
