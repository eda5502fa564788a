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
from support.processes import ServiceProcess

from rollway.common.client import ClientConfig, open_channel

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")

TESTS_DIR = str(Path(__file__).resolve().parents[1])
EXIT_WITHIN_S = 15.0  # a service drains for up to 3 s, then the interpreter (torch) exits


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def wait_all_gone(pids: dict[str, int], timeout: float) -> dict[str, int]:
    """Poll until none of `pids` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids.values()):
            return {}
        time.sleep(0.05)
    return {name: pid for name, pid in pids.items() if alive(pid)}


def read_until(proc: subprocess.Popen, marker: str, timeout: float = 180.0) -> list[str]:
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
        left = wait_all_gone(pids, EXIT_WITHIN_S)
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
    from support.processes import ServiceProcess

    workdir = Path(sys.argv[1])
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]}
    started = {}

    def start(name):
        started[name] = ServiceProcess(name, [], workdir, module="support.probe_service", env=env).start()

    start("main")
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
    short-lived thread must not lose it then, and must still take it down when the launcher dies."""
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
        assert set(pids) == {"main", "thread"}, lines
        # The starting thread is gone; the service keeps serving (checked for a while, not once).
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            assert serving(addresses["thread"]) and serving(addresses["main"])
            time.sleep(0.1)
        launcher.kill()
        launcher.wait(30)
        left = wait_all_gone(pids, EXIT_WITHIN_S)
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
        left = wait_all_gone(ranks, EXIT_WITHIN_S)
        assert not left, f"trainer ranks outlived a SIGKILLed trainer: {left}"
    finally:
        trainer.stop()
