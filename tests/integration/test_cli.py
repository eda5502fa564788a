"""The rollway command line: plan, config errors before anything starts, plot."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROLLWAY = [sys.executable, "-m", "rollway.cli"]


def rollway(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*ROLLWAY, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_plan_prints_the_batch_arithmetic(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "hf_checkpoint: /models/qwen\nprompt_data: [/data/rl.parquet]\nrollout_batch_size: 16\n"
        "n_samples_per_prompt: 8\nglobal_batch_size: 32\nnum_rollout: 10\nworld_size: 2\nmicro_batch_size: 4\n"
    )
    result = rollway("plan", str(config))
    assert result.returncode == 0, result.stderr
    # "label                    value" lines: the label is padded to 25 columns
    lines = {line[:25].strip(): line[25:].strip() for line in result.stdout.splitlines()}
    assert lines["samples per rollout"] == "128"
    assert lines["optimizer steps/rollout"] == "4"
    assert lines["trainer ranks"] == "2 (16 samples per rank per step)"
    assert lines["micro-batches"] == "4 per rank of 4 samples (packed rows)"
    assert lines["optimizer steps total"] == "40"
    # The two ranks share this machine's cores (common/cpu_threads.py); the rollout engine has them all.
    cores = len(os.sched_getaffinity(0))
    assert lines["CPU threads"] == (
        f"{max(1, cores // 2)} per trainer rank, {cores} for the CPU rollout engine (on CPU here: {cores} usable cores)"
    )
    config.write_text(config.read_text() + "cpu_threads: 3\n")
    lines = {
        line[:25].strip(): line[25:].strip() for line in rollway("plan", str(config)).stdout.splitlines()
    }
    assert lines["CPU threads"].startswith("3 per trainer rank, 3 for the CPU rollout engine")


def test_plan_says_how_the_run_ends_before_it_starts(tmp_path, demo_data_dir):
    """num_rollout wins and the data loops; num_rollout 0 runs num_epoch epochs, counted from the data."""
    config = tmp_path / "run.yaml"
    config.write_text(
        f"hf_checkpoint: /models/qwen\nprompt_data: ['{demo_data_dir / 'sft.parquet'}@[0:100]']\n"
        "input_key: messages\napply_chat_template: true\nloss_type: sft_loss\n"
        "rollout_batch_size: 8\nglobal_batch_size: 8\nnum_rollout: 0\nnum_epoch: 3\n"
    )
    lines = {
        line[:25].strip(): line[25:].strip() for line in rollway("plan", str(config)).stdout.splitlines()
    }
    assert lines["rollouts"] == "37"  # 3 x 100 // 8
    assert lines["end of data"] == "num_epoch 3 x 100 rows / rollout_batch_size 8 = 37 steps"
    result = rollway("plan", str(config), "--num-rollout", "50")
    lines = {line[:25].strip(): line[25:].strip() for line in result.stdout.splitlines()}
    assert lines["rollouts"] == "50"
    assert lines["end of data"] == "num_rollout 50 wins: the data (100 rows) loops over epochs, 4.00 epochs"


def test_plan_defaults_to_micro_batches_by_token_budget_and_shows_their_layout(tmp_path):
    """A config that says nothing about batching gets the fast path: dynamic batch size."""
    config = tmp_path / "run.yaml"
    config.write_text(
        "hf_checkpoint: /models/qwen\nprompt_data: [/data/rl.parquet]\nrollout_batch_size: 16\n"
        "n_samples_per_prompt: 8\nglobal_batch_size: 128\nrollout_max_prompt_len: 64\n"
        "rollout_max_response_len: 8\nmax_tokens_per_gpu: 1024\n"
    )
    result = rollway("plan", str(config))
    assert result.returncode == 0, result.stderr
    lines = {line[:25].strip(): line[25:].strip() for line in result.stdout.splitlines()}
    assert lines["micro-batches"] == (
        "by token budget: up to 1024 tokens each per rank (packed rows, the 8 samples of a prompt share it)"
    )
    # 16 groups of 8 samples; a group holds its prompt once: 64 + 8 x 8 = 128 tokens at most, so
    # 8 groups fit in 1024 tokens -> 2 micro-batches
    assert lines["micro-batch layout"] == (
        "groups of 8 samples of up to 128 tokens (prompt once): >= 8 groups (64 samples) per "
        "micro-batch, at most 2 micro-batches per rank per step"
    )


@pytest.mark.parametrize(
    ("yaml_text", "flags", "message"),
    [
        ("rollout_batch_size: 3\nn_samples_per_prompt: 3\nglobal_batch_size: 4\n", [], "global_batch_size:"),
        ("lr: fast\n", [], "lr: must be a number"),
        ("rollout_batch_szie: 4\n", [], "did you mean rollout_batch_size"),
        ("", ["--advantage-estimator", "ppo"], "--advantage-estimator: invalid choice: 'ppo'"),
        ("", ["--use-kl-loss", "--kl-coef", "0.1"], "kl_coef"),
    ],
)
def test_config_errors_name_the_setting_before_anything_starts(tmp_path, yaml_text, flags, message):
    config = tmp_path / "run.yaml"
    config.write_text("hf_checkpoint: /models/qwen\nprompt_data: [/data/rl.parquet]\n" + yaml_text)
    result = rollway("run", str(config), *flags, "--run-dir", str(tmp_path / "runs"))
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "runs").exists(), "nothing may start before the config is valid"


def test_a_crashed_service_is_reported_with_its_log_and_everything_stops(
    tiny_model_dir, demo_data_dir, tmp_path
):
    import os

    from support.processes import descendants, wait_all_gone

    config = tmp_path / "run.yaml"
    config.write_text(
        f"hf_checkpoint: {tiny_model_dir}\nprompt_data: [{demo_data_dir / 'rl.parquet'}]\ninput_key: prompt\n"
        "label_key: label\napply_chat_template: true\nnum_epoch: 0\nnum_rollout: 1000\nrollout_batch_size: 4\n"
        "n_samples_per_prompt: 4\nglobal_batch_size: 16\nrollout_max_response_len: 4\n"
        f"run_dir: {tmp_path / 'runs'}\nrun_id: crash\nmax_restarts: 0\n"  # no recovery: the crash report
    )
    launcher = subprocess.Popen(
        [*ROLLWAY, "run", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for line in launcher.stdout:
            if line.startswith("step 2/"):  # the run is training: kill the rollout service
                break
        # Whoever started them (the launcher or the coordinator), the services are below the launcher.
        started = descendants(launcher.pid)
        rollout = next(pid for pid, cmd in started.items() if "-m rollway.rollout " in cmd)
        os.kill(rollout, signal.SIGKILL)
        out, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1
    assert f"rollout (pid {rollout}) exited with -9; last log lines:" in out + err, out + err
    assert '"service": "rollout"' in out + err  # the tail of the rollout service's own log
    left = wait_all_gone(started, 30)  # the launcher stopped every service it started
    assert not left, [started[pid] for pid in left]


def _coordinator_kill_config(tmp_path, tiny_model_dir, demo_data_dir, max_restarts: int):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"hf_checkpoint: {tiny_model_dir}\nprompt_data: [{demo_data_dir / 'rl.parquet'}]\ninput_key: prompt\n"
        "label_key: label\napply_chat_template: true\nnum_rollout: 20\nrollout_batch_size: 4\n"
        "n_samples_per_prompt: 4\nglobal_batch_size: 16\nrollout_max_response_len: 4\n"
        f"save: {tmp_path / 'save'}\nsave_interval: 1\nrestart_backoff_seconds: 0.1\n"
        f"run_dir: {tmp_path / 'runs'}\nrun_id: coord\nmax_restarts: {max_restarts}\n"
    )
    return config


def _kill_the_coordinator_at_step_2(config) -> tuple[subprocess.Popen, int, dict[int, str], str, str]:
    """`rollway run CONFIG` with its coordinator service kill -9ed once step 2 is logged: the
    launcher, the coordinator's pid, the processes below the launcher then, its whole output."""
    import os

    from support.processes import descendants

    launcher = subprocess.Popen(
        [*ROLLWAY, "run", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        before = "".join(_read_until(launcher, "step 2/"))
        started = descendants(launcher.pid)
        coordinator = next(pid for pid, cmd in started.items() if "-m rollway.coordinator " in cmd)
        os.kill(coordinator, signal.SIGKILL)
        out, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    return launcher, coordinator, started, before + out, err


def _no_traceback(output: str) -> bool:
    return "_InactiveRpcError" not in output and not any(
        line.startswith("Traceback") for line in output.splitlines()
    )


def test_a_killed_coordinator_without_restarts_is_reported_with_its_log_not_a_traceback(
    tiny_model_dir, demo_data_dir, tmp_path
):
    from support.processes import wait_all_gone

    config = _coordinator_kill_config(tmp_path, tiny_model_dir, demo_data_dir, max_restarts=0)
    launcher, coordinator, started, out, err = _kill_the_coordinator_at_step_2(config)
    assert launcher.returncode == 1, out + err
    assert f"service crashed: coordinator (pid {coordinator}) exited with -9; last log lines:" in err, err
    assert '"service": "coordinator"' in err  # the tail of the coordinator's own log
    assert _no_traceback(out + err), out + err
    assert "restarting the coordinator" not in err
    assert not (tmp_path / "runs" / "coord" / "result.json").exists()
    # The services the coordinator had started die with it (parent watch).
    names = sorted(cmd.split("-m rollway.")[1].split()[0] for cmd in started.values() if "-m rollway." in cmd)
    assert names == ["coordinator", "dataloader", "rollout", "trainer"]
    left = wait_all_gone(started, 30)
    assert not left, [started[pid] for pid in left]


def test_a_killed_coordinator_is_restarted_and_the_run_succeeds(tiny_model_dir, demo_data_dir, tmp_path):
    import json

    config = _coordinator_kill_config(tmp_path, tiny_model_dir, demo_data_dir, max_restarts=2)
    launcher, coordinator, _, out, err = _kill_the_coordinator_at_step_2(config)
    assert launcher.returncode == 0, out + err
    assert f"service crashed: coordinator (pid {coordinator}) exited with -9" in err, err
    assert "restarting the coordinator (1/2)" in err
    assert "restarting the coordinator (2/2)" not in err
    assert "run coord SUCCEEDED" in out
    assert _no_traceback(out + err), out + err
    # The resumed attempt's stream replays the first attempt's steps: the console shows them once,
    # and the resumed attempt's lines from the step it resumed at on.
    shown = [
        int(line.split("/")[0].removeprefix("step ")) for line in out.splitlines() if line.startswith("step ")
    ]
    steps_back = [i for i in range(1, len(shown)) if shown[i] <= shown[i - 1]]  # where it resumed
    assert len(steps_back) <= 1 and shown.count(1) == 1 and shown[-1] == 20, shown
    run_dir = tmp_path / "runs" / "coord"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(20))  # each step once: the resumed run replaced what it redid
    result = json.loads((run_dir / "result.json").read_text())
    assert Path(result["checkpoint_dir"]).name == "rollout_0000020"


SERVICE_CONFIGS = {
    "dataloader": ("rollway.dataloader.config", "DataloaderConfig"),
    "rollout": ("rollway.rollout.config", "RolloutConfig"),
    "trainer": ("rollway.trainer.config", "TrainerConfig"),
    "coordinator": ("rollway.coordinator.config", "CoordinatorServiceConfig"),
}


@pytest.mark.parametrize("service", sorted(SERVICE_CONFIGS))
def test_serve_help_lists_every_flag_of_that_service(service):
    import dataclasses
    import importlib

    from rollway.common.config import flag_name
    from rollway.common.server import ServerConfig

    module, name = SERVICE_CONFIGS[service]
    config_class = getattr(importlib.import_module(module), name)
    result = rollway("serve", service, "--help")
    assert result.returncode == 0, result.stderr
    listed = {word.rstrip(",") for line in result.stdout.splitlines() for word in line.split()}
    for cls in (ServerConfig, config_class):
        for field in dataclasses.fields(cls):
            flag = flag_name(field.name)
            assert flag in listed or f"{flag}," in listed, f"{flag} ({cls.__name__}) missing from --help"


def _up_workdir(tmp_path, tiny_model_dir):
    """A `rollway up --workdir` with the session's tiny model already in place (not built again)."""
    workdir = tmp_path / "up"
    workdir.mkdir()
    (workdir / "tiny-model").symlink_to(tiny_model_dir)
    return workdir


UP_LINE = re.compile(r"(\w+)\s+SERVING\s+127\.0\.0\.1:(\d+)\s+pid (\d+)\s+log (\S+)")


def test_up_starts_the_four_services_then_stops_each_cleanly(tmp_path, tiny_model_dir):
    result = rollway("up", "--workdir", str(_up_workdir(tmp_path, tiny_model_dir)))
    assert result.returncode == 0, result.stdout + result.stderr
    serving = [UP_LINE.match(line) for line in result.stdout.splitlines() if UP_LINE.match(line)]
    assert [m.group(1) for m in serving] == ["dataloader", "rollout", "trainer", "coordinator"]
    stopped = [line.split() for line in result.stdout.splitlines() if " stopped " in line]
    assert stopped == [
        [name, "stopped", "(exit", "0)"] for name in ("coordinator", "trainer", "rollout", "dataloader")
    ]
    for match in serving:
        assert not _alive(int(match.group(3))), match.group(1)


def test_up_hold_serves_until_sigterm_then_stops_each_cleanly(tmp_path, tiny_model_dir):
    up = subprocess.Popen(
        [*ROLLWAY, "up", "--hold", "--workdir", str(_up_workdir(tmp_path, tiny_model_dir))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = _read_until(up, "all four services are up")
        ports = [int(m.group(2)) for m in map(UP_LINE.match, lines) if m]
        assert len(ports) == 4, lines
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from rollway.common.client import open_channel

        for port in ports:  # still serving while held
            with open_channel(f"127.0.0.1:{port}") as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 0, out
    stopped = [line.split() for line in out.splitlines() if " stopped " in line]
    assert stopped == [
        [name, "stopped", "(exit", "0)"] for name in ("coordinator", "trainer", "rollout", "dataloader")
    ]


def _read_until(proc: subprocess.Popen, marker: str, timeout: float = 180.0) -> list[str]:
    """Lines of `proc`'s stdout up to the one starting with `marker` (a deadline, not a hang)."""
    import threading

    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(marker):
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(timeout):
        proc.kill()
        raise AssertionError(f"no {marker!r} within {timeout:.0f}s:\n{''.join(lines)}")
    return lines


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
