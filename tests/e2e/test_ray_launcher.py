"""Runs whose services are Ray actors (`launcher: ray`) on a local Ray cluster (CPU only, shared by
the tests of this module).

The coordinator places the run: two trainer ranks are two actors forming one torch.distributed
group, one rollout actor per engine, a dataloader actor; gRPC and weight sync are those of a local
run. `rollway run --launcher ray` starts a local coordinator that does this; so does StartRun with
`launcher: ray` from any client. The coordinator restarts a dead actor and the run goes on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml
from support.jsonl import read_metrics
from support.processes import ServiceProcess, descendants, wait_all_gone
from support.stack import coordinator_stub, start_run, wait_run

from rollway.common.client import ClientConfig, open_channel
from rollway.common.structs import to_struct
from rollway.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from rollway.dataloader.v1 import dataloader_pb2, dataloader_pb2_grpc
from rollway.deploy.launcher import run

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

REWARD_MODULE = '''
def odd_index(sample):
    """Half of every group scores 1: every group has reward variance, so GRPO has a gradient."""
    return float(sample.index % 2)
'''


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray cluster with 8 logical CPUs, which coordinators started by the tests join
    (RAY_ADDRESS); its workers can import the test's reward module."""
    reward_dir = tmp_path_factory.mktemp("reward")
    (reward_dir / "ray_test_reward.py").write_text(REWARD_MODULE)
    previous = {name: os.environ.get(name) for name in ("PYTHONPATH", "RAY_ADDRESS")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(reward_dir), previous["PYTHONPATH"]]))
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    try:
        yield os.environ["RAY_ADDRESS"]
    finally:
        ray.shutdown()
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def write_config(path: Path, **settings) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


def sft_settings(tmp_path: Path, model_dir: Path, data_dir: Path, run_id: str, **extra) -> dict:
    return {
        "run_id": run_id,
        "run_dir": str(tmp_path / "runs"),
        "hf_checkpoint": str(model_dir),
        "loss_type": "sft_loss",
        "prompt_data": [str(data_dir / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "num_rollout": 4,
        "rollout_batch_size": 16,
        "global_batch_size": 16,
        "lr": 3e-3,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        **extra,
    }


def sft_config(tmp_path: Path, model_dir: Path, data_dir: Path, run_id: str, **extra) -> Path:
    return write_config(
        tmp_path / f"{run_id}.yaml", **sft_settings(tmp_path, model_dir, data_dir, run_id, **extra)
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


def ray_placement(run_dir: Path) -> dict:
    """What the coordinator wrote about the run's actors: {"actors": {name: {node, address, pid,
    generation, ...}}, "placement_settings": {...}}."""
    return json.loads((run_dir / "services" / "ray.json").read_text())


def pids(run_dir: Path) -> dict[str, int]:
    return {name: actor["pid"] for name, actor in ray_placement(run_dir)["actors"].items()}


def run_actors(run_id: str) -> list[str]:
    """The run's actors Ray still lists (in any namespace)."""
    named = ray.util.list_named_actors(all_namespaces=True)
    return [a["name"] for a in named if a["name"].startswith(f"rollway-{run_id}-")]


def ray_actor(name: str):
    return ray.get_actor(name, namespace="rollway")


def wait_for_metrics(run_dir: Path, num_records: int, timeout: float = 240.0) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= num_records:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{metrics} has fewer than {num_records} records after {timeout:.0f}s")


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
    run_dir = tmp_path / "runs" / "sft-ray"
    started = pids(run_dir)
    assert set(started) == {"trainer-0", "trainer-1", "dataloader"}  # no rollout for SFT
    assert all(pid > 0 for pid in started.values()) and not wait_all_gone(started.values(), 10)
    rank1_log = (run_dir / "services" / "trainer-1" / "process.log").read_text()
    assert '"rank": 1' in rank1_log and "rank ready" in rank1_log
    placed = ray_placement(run_dir)
    trainer_node = placed["actors"]["trainer-0"]["node"]
    assert placed["placement_settings"]["master_addr"] == trainer_node  # the ranks meet at rank 0
    assert placed["placement_settings"]["spawn_workers"] is False

    local_config = sft_config(tmp_path, tiny_model_dir, demo_data_dir, "sft-local", world_size=1)
    assert run([str(local_config)]) == 0
    on_ray = [r["sft/loss"] for r in read_metrics(run_dir)]
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
    assert "run grpo-ray SUCCEEDED" in capfd.readouterr().out
    run_dir = tmp_path / "runs" / "grpo-ray"
    assert set(pids(run_dir)) == {"trainer-0", "trainer-1", "rollout-0", "dataloader"}
    steps = [r for r in read_metrics(run_dir) if "train/loss" in r]
    assert len(steps) == 2
    versions = [r["rollout/weight_version"] for r in steps]
    assert versions[1] == versions[0] + 1 and all(r["perf/weight_sync_time"] > 0 for r in steps)
    assert [r["rollout/raw_reward"] for r in steps] == [0.5, 0.5]
    assert all(r["train/grad_norm"] > 0 for r in steps)
    # The engine generated with the weights the trainer ranks hold: same log-probs up to noise.
    assert all(r["train/train_rollout_logprob_abs_diff"] < 1e-3 for r in steps)
    # The weight group meets at trainer rank 0's node, on a port picked there.
    placed = ray_placement(run_dir)
    trainer_node = placed["actors"]["trainer-0"]["node"]
    assert placed["placement_settings"]["update_weight_master_addr"] == trainer_node
    assert placed["placement_settings"]["update_weight_master_port"] > 0
    assert placed["actors"]["rollout-0"]["address"].rsplit(":", 1)[0] == trainer_node


def describe_status(address: str, token: str) -> grpc.StatusCode:
    stub = dataloader_pb2_grpc.DataloaderServiceStub(open_channel(address, ClientConfig(auth_token=token)))
    try:
        stub.Describe(dataloader_pb2.DescribeRequest())
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.slow
def test_a_dead_rollout_actor_is_restarted_in_its_bundle_and_the_run_goes_on(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path, monkeypatch
):
    settings = yaml.safe_load(
        rl_config(tmp_path, tiny_model_dir, demo_data_dir, "dies", debug_rollout_only=True).read_text()
    )
    settings.update(
        launcher="ray",
        num_rollout=100000,
        restart_backoff_seconds=0.1,
        save=str(tmp_path / "ckpt"),  # a checkpoint every step: the run resumes where it was
        save_interval=1,
    )
    monkeypatch.setenv("ROLLWAY_AUTH_TOKEN", "ray-token")  # forwarded to the actors' services
    run_dir = tmp_path / "runs" / "dies"
    coordinator_args = ["--runs-root", str(tmp_path / "runs")]
    with ServiceProcess(
        "coordinator", coordinator_args, tmp_path, client_config=ClientConfig(auth_token="ray-token")
    ) as coordinator:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(
            open_channel(coordinator.address, ClientConfig(auth_token="ray-token"))
        )
        stub.StartRun(coordinator_pb2.StartRunRequest(config=to_struct(settings), run_id="dies"))
        wait_for_metrics(run_dir, 1)
        before = ray_placement(run_dir)["actors"]
        dataloader = before["dataloader"]["address"]
        statuses = (describe_status(dataloader, "wrong"), describe_status(dataloader, "ray-token"))
        ray.kill(ray_actor("rollway-dies-rollout-0"))
        num_steps_at_kill = len(read_metrics(run_dir))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # restarted, and two more steps made on the new actor
            info = stub.GetRun(coordinator_pb2.GetRunRequest(run_id="dies")).run
            if info.state != coordinator_pb2.RUN_STATE_RUNNING:
                break
            if info.num_restarts == 1 and len(read_metrics(run_dir)) >= num_steps_at_kill + 2:
                break
            time.sleep(0.2)
        assert info.state == coordinator_pb2.RUN_STATE_RUNNING and info.num_restarts == 1, info.error
        after = ray_placement(run_dir)["actors"]
        assert info.service_addresses["rollout_0"] == after["rollout-0"]["address"]
        stub.StopRun(coordinator_pb2.StopRunRequest(run_id="dies", immediate=True))
        info = wait_run(stub, "dies")
    assert info.state == coordinator_pb2.RUN_STATE_STOPPED, info.error
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == list(range(len(steps))) and len(steps) >= num_steps_at_kill + 2  # each step once
    assert after["rollout-0"]["generation"] == 1 and after["rollout-0"]["pid"] != before["rollout-0"]["pid"]
    assert after["rollout-0"]["node"] == before["rollout-0"]["node"]  # the same bundle
    assert after["dataloader"] == before["dataloader"]  # only the dead one was replaced
    assert (run_dir / "services" / "rollout-0" / "process-1.log").exists()
    started = [actor["pid"] for actor in (*before.values(), *after.values())]
    assert not wait_all_gone(started, 10)  # the dead one died with its actor, the rest were stopped
    assert not run_actors("dies")
    assert statuses == (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OK)


def test_runs_that_do_not_fit_the_cluster_fail_before_any_actor_starts(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path, capfd
):
    sglang = rl_config(tmp_path, tiny_model_dir, demo_data_dir, "sglang", rollout_engine="sglang")
    assert run([str(sglang), "--launcher", "ray"]) == 1
    assert "cannot place the run on Ray: rollout_engine sglang needs GPUs" in capfd.readouterr().out
    too_big = sft_config(tmp_path, tiny_model_dir, demo_data_dir, "big", world_size=9)
    assert run([str(too_big), "--launcher", "ray"]) == 1
    assert "the run's actors need 10 CPU in total and the Ray cluster has 8" in capfd.readouterr().out
    assert not (tmp_path / "runs" / "big" / "services" / "ray.json").exists()
    assert not run_actors("big") and not run_actors("sglang")
    # A custom resource no node has: refused when the coordinator reads the nodes, not after Ray's wait.
    labelled = sft_config(
        tmp_path, tiny_model_dir, demo_data_dir, "label", ray_trainer_resources={"node_trainer": 1}
    )
    assert run([str(labelled), "--launcher", "ray"]) == 1
    assert (
        "cannot place the run on Ray: ray_trainer_resources: trainer-0 asks for node_trainer 1, and no node "
        "of the Ray cluster has node_trainer; the nodes have: "
    ) in capfd.readouterr().out
    assert not run_actors("label")
    spread = sft_config(
        tmp_path, tiny_model_dir, demo_data_dir, "spread", ray_placement_strategy="STRICT_SPREAD"
    )
    assert run([str(spread), "--launcher", "ray"]) == 1
    assert (
        "cannot place the run on Ray: ray_placement_strategy: STRICT_SPREAD puts each of the run's 2 actors "
        "on a node of its own, and the Ray cluster has 1 node: "
    ) in capfd.readouterr().out


def test_plan_says_where_each_actor_would_go_and_that_one_node_cannot_survive_its_loss(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path
):
    config = sft_config(
        tmp_path,
        tiny_model_dir,
        demo_data_dir,
        "plan",
        world_size=2,
        launcher="ray",
        ray_dataloader_num_cpus=2,
    )
    result = subprocess.run(  # joins the module's cluster through RAY_ADDRESS, reads its nodes, leaves
        [sys.executable, "-m", "rollway.cli", "plan", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    node = ray.nodes()[0]["NodeManagerAddress"]
    out = result.stdout
    assert f"Ray cluster: the Ray cluster at {ray_cluster}\nRay placement (PACK; " in out
    assert re.search(
        rf"  trainer-1 +CPU 1 +-> {re.escape(node)}\n  dataloader +CPU 2 +-> {re.escape(node)}\n", out
    ), out
    assert f"nodes: {node} (CPU 8)" in out
    assert (
        f"survives the loss of any one node: no\n  losing {node}: trainer-0, trainer-1, dataloader would have "
        "nowhere to go: the cluster has no other node"
    ) in out


def test_a_service_that_cannot_start_is_reported_with_its_log(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path, capfd
):
    not_a_model = tmp_path / "not-a-model"  # passes StartRun's checks (a config.json), fails to load
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    config = sft_config(tmp_path, not_a_model, demo_data_dir, "no-model")
    assert run([str(config), "--launcher", "ray"]) == 1
    out = capfd.readouterr().out
    assert re.search(
        r"run no-model FAILED: RayStartError: could not start on Ray: (trainer-0|dataloader) exited with \d+ "
        r"before serving",
        out,
    ), out
    assert "no-such-architecture" in out and "ray::" not in out
    assert not run_actors("no-model")


@pytest.mark.slow
def test_start_run_with_launcher_ray_on_a_plain_coordinator_runs_sft_on_ray(
    ray_cluster, tiny_model_dir, demo_data_dir, tmp_path, monkeypatch
):
    """Any gRPC client can ask for Ray: the run's settings say where its services go."""
    settings = sft_settings(tmp_path, tiny_model_dir, demo_data_dir, "grpc-ray", num_rollout=3)
    settings.update(launcher="ray", ray_address=ray_cluster)
    monkeypatch.delenv("RAY_ADDRESS")  # the first run names its cluster, the second none
    with ServiceProcess("coordinator", ["--runs-root", str(tmp_path / "runs")], tmp_path) as coordinator:
        stub = coordinator_stub(coordinator)
        info = wait_run(stub, start_run(stub, "grpc-ray", settings).run_id)
        assert info.state == coordinator_pb2.RUN_STATE_SUCCEEDED, info.error
        assert (info.step, info.num_steps) == (3, 3)
        losses = [r["sft/loss"] for r in read_metrics(Path(info.run_dir))]
        assert len(losses) == 3 and losses[-1] < losses[0]
        actors = ray_placement(Path(info.run_dir))["actors"]
        assert dict(info.service_addresses) == {
            "trainer": actors["trainer-0"]["address"],
            "dataloader": actors["dataloader"]["address"],
        }
        assert not run_actors("grpc-ray") and not wait_all_gone([a["pid"] for a in actors.values()], 10)
        # The coordinator serves on. A run that names no cluster (and no RAY_ADDRESS): the
        # coordinator starts a Ray instance of its own for it, and ends it with the run.
        second = {**settings, "run_id": "grpc-ray-2", "num_rollout": 1, "ray_address": ""}
        info = wait_run(stub, start_run(stub, "grpc-ray-2", second).run_id)
        assert info.state == coordinator_pb2.RUN_STATE_SUCCEEDED, info.error
        assert len(read_metrics(Path(info.run_dir))) == 1
        deadline = time.monotonic() + 30
        while descendants(coordinator.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not descendants(coordinator.pid)  # its Ray processes, the actors and theirs
        assert coordinator.log_text().count("Started a local Ray instance") == 1  # for the second run
