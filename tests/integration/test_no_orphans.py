"""Never orphan: processes a launcher started exit within seconds when it dies, even by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import ServiceProcess, alive, descendants, read_until, wait_all_gone

from rollway.common.client import ClientConfig, open_channel

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")

TESTS_DIR = str(Path(__file__).resolve().parents[1])
EXIT_WITHIN_S = 15.0  # a service drains for up to 3 s, then the interpreter (torch) exits


def serving(address: str) -> bool:
    with open_channel(address, ClientConfig(max_retries=0)) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_services_exit_within_seconds_when_rollway_up_is_killed(tmp_path, tiny_model_dir):
    workdir = tmp_path / "up"
    workdir.mkdir()
    (workdir / "tiny-model").symlink_to(tiny_model_dir)
    up = subprocess.Popen(
        [sys.executable, "-m", "rollway.cli", "up", "--hold", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pids: dict[str, int] = {}
    try:
        for line in read_until(up, "all four services are up"):
            words = line.split()
            if len(words) > 4 and words[1] == "SERVING":
                pids[words[0]] = int(words[4])
        assert set(pids) == {"dataloader", "rollout", "trainer", "coordinator"}
        for name, pid in pids.items():
            assert os.getpgid(pid) == pid, f"{name} runs in a process group of its own"
        up.kill()
        up.wait(30)
        killed_at = time.monotonic()
        left = wait_all_gone(pids.values(), EXIT_WITHIN_S)
        assert not left, f"still running {EXIT_WITHIN_S:.0f}s after the launcher was killed: {left}"
        print(f"all four services gone {time.monotonic() - killed_at:.2f}s after SIGKILL of rollway up")
    finally:
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if up.poll() is None:
            up.kill()


LAUNCHER = textwrap.dedent(
    """
    import os, sys, threading
    from pathlib import Path
    from support.processes import ServiceProcess, alive, descendants, wait_all_gone

    workdir = Path(sys.argv[1])
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]}
    started = {}

    def start(name):
        started[name] = ServiceProcess(name, [], workdir, module="support.probe_service", env=env).start()

    start("main")
    gateway = ["--token", "tml-orphan-test", "--workdir", str(workdir / "gateway")]
    started["gateway"] = ServiceProcess("gateway", gateway, workdir, module="rollway.gateway",
                                        wait_serving=False, env=env).start()  # fmt: skip
    worker = threading.Thread(target=start, args=("thread",))
    worker.start()
    worker.join()  # the thread that forked "thread" has exited
    for name, svc in started.items():
        print(name, svc.pid, svc.address, flush=True)
    print("ready", flush=True)
    sys.stdin.read()  # until killed
    """
)


def test_a_service_outlives_the_thread_that_started_it_but_not_its_launcher(tmp_path):
    """PR_SET_PDEATHSIG fires when the forking *thread* exits: a launcher that starts a service from a
    short-lived thread must not lose it then, and must still take it down when the launcher dies.
    The Tinker gateway, not a gRPC service, goes with its launcher too."""
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    env = {**os.environ, "PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")}
    launcher = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "work")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    pids: dict[str, int] = {}
    try:
        lines = read_until(launcher, "ready", timeout=60)
        addresses = {}
        for line in lines[:-1]:
            name, pid, address = line.split()
            pids[name], addresses[name] = int(pid), address
        assert set(pids) == {"main", "thread", "gateway"}, lines  # the Tinker gateway: an HTTP server
        # The starting thread is gone; the service keeps serving (checked for a while, not once).
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            assert serving(addresses["thread"]) and serving(addresses["main"])
            time.sleep(0.1)
        launcher.kill()
        launcher.wait(30)
        left = wait_all_gone(pids.values(), EXIT_WITHIN_S)
        assert not left, f"still running after the launcher was killed: {left}"
    finally:
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()


def test_trainer_ranks_exit_when_the_trainer_is_killed(tiny_model_dir, tmp_path):
    args = ["--hf-checkpoint", str(tiny_model_dir), "--world-size", "2", "--dtype", "float32"]
    trainer = ServiceProcess("trainer", [*args, "--loss-type", "sft_loss"], tmp_path).start()
    try:
        children = Path(f"/proc/{trainer.pid}/task/{trainer.pid}/children").read_text().split()
        ranks = {f"rank {i + 1}": int(pid) for i, pid in enumerate(children)}
        assert len(ranks) == 1, children
        trainer.signal(signal.SIGKILL)
        left = wait_all_gone(ranks.values(), EXIT_WITHIN_S)
        assert not left, f"trainer ranks outlived a SIGKILLed trainer: {left}"
    finally:
        trainer.stop()


def test_every_process_of_rollway_run_exits_when_it_is_killed_mid_run(
    tmp_path, tiny_model_dir, demo_data_dir
):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"hf_checkpoint: {tiny_model_dir}\nprompt_data: [{demo_data_dir / 'rl.parquet'}]\ninput_key: prompt\n"
        "label_key: label\napply_chat_template: true\nnum_epoch: 0\nnum_rollout: 1000\nrollout_batch_size: 4\n"
        "n_samples_per_prompt: 4\nglobal_batch_size: 16\nrollout_max_response_len: 4\n"
        f"run_dir: {tmp_path / 'runs'}\nrun_id: killed\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "rollway.cli", "run", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started: dict[int, str] = {}
    try:
        read_until(run, "step 2/")  # the run is training
        started = descendants(run.pid)
        names = {
            service
            for service in ("coordinator", "dataloader", "rollout", "trainer")
            if any(f"-m rollway.{service} " in cmd for cmd in started.values())
        }
        assert names == {"coordinator", "dataloader", "rollout", "trainer"}, started
        run.kill()
        run.wait(30)
        killed_at = time.monotonic()
        left = wait_all_gone(started, EXIT_WITHIN_S)
        assert not left, f"orphans of a SIGKILLed `rollway run`: {[started[pid] for pid in left]}"
        print(
            f"{len(started)} processes gone {time.monotonic() - killed_at:.2f}s after SIGKILL of rollway run"
        )
    finally:
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
