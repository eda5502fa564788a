"""The Ray service group's actor layout (pure logic: no Ray cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollway.common.supervision.placement import PlacementError, check_fits, describe, plan_actors
from rollway.coordinator import run_config
from rollway.deploy.launcher import parse_run_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "ray" / "grpo-8gpu.yaml"


def layout(*flags: str, gpus: float = 8.0):
    """The actors of the example run with `flags`, for the services the coordinator would start."""
    given: dict = {}
    run = run_config.RunConfig(**parse_run_config([str(EXAMPLE), *flags], given=given), given=given)
    missing = [name for name, addresses in run.addresses().items() if not addresses]
    return plan_actors({"trainer": run.trainer, "rollout": run.rollout}, missing, gpus)


def test_eight_gpus_hold_four_trainer_ranks_and_two_sglang_engines_with_tp_2():
    specs = layout()
    assert [(s.name, s.resources) for s in specs] == [
        ("trainer-0", {"CPU": 1.0, "GPU": 1.0}),
        ("trainer-1", {"CPU": 1.0, "GPU": 1.0}),
        ("trainer-2", {"CPU": 1.0, "GPU": 1.0}),
        ("trainer-3", {"CPU": 1.0, "GPU": 1.0}),
        ("rollout-0", {"CPU": 1.0, "GPU": 2.0}),
        ("rollout-1", {"CPU": 1.0, "GPU": 2.0}),
        ("dataloader", {"CPU": 1.0}),
    ]  # the coordinator places the run: it is no actor of it
    assert [s.is_trainer_worker for s in specs[:4]] == [False, True, True, True]
    assert "rollout-1      CPU 1, GPU 2" in describe(specs)
    check_fits(specs, {"CPU": 64.0, "GPU": 8.0})
    with pytest.raises(PlacementError, match="need 7 CPU in total and the Ray cluster has 4"):
        check_fits(specs, {"CPU": 4.0, "GPU": 8.0})


def test_attached_services_get_no_actor_and_gpus_are_counted():
    specs = layout("--trainer-addr", "10.0.0.5:50051", "--dataloader-addr", "10.0.0.5:50053")
    assert [s.name for s in specs] == ["rollout-0", "rollout-1"]
    with pytest.raises(PlacementError, match="needs 8 GPUs and the Ray cluster has 6"):
        layout(gpus=6.0)
    with pytest.raises(PlacementError, match="sglang needs GPUs"):
        layout(gpus=0.0)
    with pytest.raises(PlacementError, match="must be a multiple of rollout_num_gpus_per_engine"):
        layout("--rollout-engine", "hf", "--rollout-num-gpus", "3", gpus=8.0)


def test_a_cpu_cluster_runs_the_hf_engine_without_gpu_requests():
    specs = layout("--rollout-engine", "hf", "--world-size", "2", "--rollout-num-gpus", "2", gpus=0.0)
    assert [(s.name, s.resources) for s in specs] == [
        ("trainer-0", {"CPU": 1.0}),
        ("trainer-1", {"CPU": 1.0}),
        ("rollout-0", {"CPU": 1.0}),
        ("dataloader", {"CPU": 1.0}),
    ]


@pytest.mark.ray
def test_an_unreachable_ray_address_is_refused_at_once(tmp_path, tiny_model_dir):
    import subprocess
    import sys
    import time

    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollway.cli",
            "run",
            str(EXAMPLE),
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-max-response-len",
            "64",
            "--run-dir",
            str(tmp_path / "runs"),
            "--launcher",
            "ray",
            "--ray-address",
            "127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    # The coordinator joins the cluster when it starts the run's services: the run fails at once.
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED: RayStartError: cannot reach the Ray cluster: nothing answers at 127.0.0.1:1" in (
        result.stdout
    )
    assert time.monotonic() - started < 60  # not Ray's minutes of retries


TOKEN_HEAD = """
import sys, ray
ray.init(num_cpus=1, include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes it
ray.shutdown()
"""


@pytest.mark.ray
def test_a_head_with_token_auth_that_answers_is_named_as_the_likely_cause(tmp_path, tiny_model_dir):
    """A Ray head with RAY_AUTH_MODE=token answers on its port, and a coordinator without the token
    cannot join: the run fails naming Ray's token auth and what to set, not only 'cannot reach'."""
    import os
    import subprocess
    import sys
    import time

    head_env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "rollway-test-" + "0" * 32}
    head = subprocess.Popen(
        [sys.executable, "-c", TOKEN_HEAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=head_env,
    )
    try:
        address = head.stdout.readline().strip()  # ray.init's own start deadline bounds this
        assert address.count(":") == 1, address
        (tmp_path / "home").mkdir()
        driver_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        driver_env["HOME"] = str(tmp_path / "home")  # no ~/.ray/auth_token either
        # Ray's driver retries the refused GCS connection NUM_REDIS_GET_RETRIES times, ~1 s each
        # (20 by default): 3 fail the same way, and the message is what this test checks.
        driver_env["RAY_NUM_REDIS_GET_RETRIES"] = "3"
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "rollway.cli", "run", str(EXAMPLE), "--hf-checkpoint", str(tiny_model_dir),
             "--rollout-max-response-len", "64", "--run-dir", str(tmp_path / "runs"), "--launcher", "ray",
             "--ray-address", address],
            capture_output=True, text=True, timeout=180, cwd=tmp_path, env=driver_env,
        )  # fmt: skip
        assert result.returncode == 1, result.stdout + result.stderr
        assert "FAILED: RayStartError: cannot reach the Ray cluster: " in result.stdout
        assert (
            f"; the head answers at {address}, so the likely cause is Ray's token auth: a head started with "
            "RAY_AUTH_MODE=token (or with ~/.ray/auth_token) needs RAY_AUTH_MODE=token and the same token "
            "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) in the coordinator's environment "
            "(here RAY_AUTH_MODE is unset)"
        ) in result.stdout, result.stdout
        assert time.monotonic() - started < 60  # Ray's few retries, not minutes
    finally:
        head.stdin.close()  # the head shuts its Ray instance down and exits
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()


def test_trainer_ranks_started_elsewhere_need_a_fixed_store_port():
    from rollway.common.config import ConfigError, from_dict
    from rollway.trainer.config import TrainerConfig

    base = {"hf_checkpoint": "/m", "world_size": 2, "spawn_workers": False}
    with pytest.raises(ConfigError, match="master_port: must be set with spawn_workers false"):
        from_dict(TrainerConfig, base)
    assert from_dict(TrainerConfig, {**base, "master_port": 29501}).master_port == 29501
    assert from_dict(TrainerConfig, {**base, "world_size": 1}).spawn_workers is False  # nothing to dial
