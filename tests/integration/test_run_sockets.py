"""Every socket a run listens on is bound to the run's address (loopback by default): gRPC,
the dashboard, the trainer's command store and gloo group, the weight group's store.

Read from the sockets themselves (psutil, per process), never by sending traffic from another
address. The run uses an auth token, so the weight group forms only after every member proved
the run's secret, and the run still completes.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys

import psutil
from support.processes import alive, descendants, read_until

RUN_ADDRESS = "127.0.0.1"
TOKEN = "run-sockets-token"


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on; an IPv6 socket bound to an IPv4
    address (::ffff:127.0.0.1, as gRPC binds) counts as that address: it accepts nothing else."""
    try:
        connections = psutil.Process(pid).net_connections("tcp")
    except psutil.NoSuchProcess:  # a process that ended between the listing and now
        return set()
    return {(_unmapped(c.laddr.ip), c.laddr.port) for c in connections if c.status == "LISTEN"}


def _unmapped(address: str) -> str:
    ip = ipaddress.ip_address(address)
    return str(ip.ipv4_mapped) if ip.version == 6 and ip.ipv4_mapped else address


def test_every_listening_socket_of_a_run_is_on_the_runs_address(tmp_path, tiny_model_dir, demo_data_dir):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"hf_checkpoint: {tiny_model_dir}\nprompt_data: [{demo_data_dir / 'rl.parquet'}]\ninput_key: prompt\n"
        "label_key: label\napply_chat_template: true\nnum_epoch: 0\nnum_rollout: 3\nrollout_batch_size: 4\n"
        "n_samples_per_prompt: 4\nglobal_batch_size: 16\nrollout_max_response_len: 4\nworld_size: 2\n"
        f"run_dir: {tmp_path / 'runs'}\nrun_id: sockets\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "rollway.cli", "run", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "ROLLWAY_AUTH_TOKEN": TOKEN},
    )
    started: dict[int, str] = {}
    try:
        # Step 1 runs after the first weight sync: the weight group (and its store) is up.
        read_until(run, "step 1/", timeout=300)
        started = descendants(run.pid)
        sockets = {pid: listening(pid) for pid in [run.pid, *started]}
        everywhere = {(pid, address) for pid, found in sockets.items() for address, _ in found}
        assert {address for _, address in everywhere} == {RUN_ADDRESS}, {
            started.get(pid, "rollway run"): found for pid, found in sockets.items() if found
        }

        def of(service: str) -> set[tuple[str, int]]:
            pids = [pid for pid, cmd in started.items() if f"-m rollway.{service} " in cmd]
            assert len(pids) == 1, started
            return sockets[pids[0]]

        # What was checked is really there: gRPC and the dashboard; the trainer's gRPC, its
        # command store, its default group's gloo listener and the weight group's store and gloo.
        assert len(of("coordinator")) >= 2
        assert len(of("trainer")) >= 5, of("trainer")
        assert all(len(of(service)) >= 1 for service in ("dataloader", "rollout"))
        assert run.wait(300) == 0  # the run completes: every member proved the run's secret
    finally:
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait(30)
