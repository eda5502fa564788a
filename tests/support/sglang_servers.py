"""Real SGLang servers for the tests marked `sglang`, from the virtualenvs `make sglang-cpu` makes.

Each server is launched with rollway's own launch command (the guard, SGLang's interpreter, the
CPU route's flags) and stopped by its process group's id, never by name. Without an install the
tests skip naming why; on CI (CI set) they fail instead, since CI must run them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.sglang_cpu import cpu_settings, installed_version
from rollway.rollout.engines.sglang_http import SGLangClient
from rollway.rollout.engines.sglang_server import launch_command, launch_env
from support.ports import free_port
from support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
# The releases the adapter is tested against: the newest (weight-update sessions) and 0.5.20 (none).
VERSIONS = ("0.5.23", "0.5.20")
NEWEST = VERSIONS[0]
START_SECONDS = 240.0  # 22-54 s measured on a loaded 2-core machine; two at once take longer


def sglang_venv(version: str) -> Path:
    """The virtualenv holding SGLang `version`; skips (fails on CI) when it is not installed."""
    venv = REPO / ".cache" / f"sglang-{version}"
    if installed_version(venv) != version:
        reason = (
            f"SGLang {version} is not installed in {venv}: `make sglang-cpu` installs it "
            "(it needs the package registry)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return venv


def rollout_settings(version: str, model_dir: Path, **overrides) -> dict:
    """Rollout settings of an sglang engine on this CPU (the CPU route's settings, float32)."""
    return {
        "hf_checkpoint": str(model_dir),
        "dtype": "float32",
        **cpu_settings(sglang_venv(version)),
        **overrides,
    }


class SGLangServer:
    """One real server started by a test (for `--sglang-urls`), in its own process group."""

    def __init__(self, version: str, model_dir: Path, log_path: Path):
        self.version = version
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        config = RolloutConfig(**rollout_settings(version, model_dir, sglang_port=self.port))
        self.command = launch_command(config, 0, self.port)
        self.env = launch_env(config)
        self.client = SGLangClient(self.url, timeout=120.0)
        self.proc: subprocess.Popen | None = None

    def start(self) -> SGLangServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        return self

    def wait_healthy(self, timeout: float = START_SECONDS) -> SGLangServer:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"SGLang {self.version} exited {self.proc.returncode}:\n{self.log_tail()}"
                )
            return self.client.healthy(timeout=10.0)

        wait_until(up, timeout=timeout, what=f"SGLang {self.version} at {self.url} to be healthy", poll=0.5)
        return self

    def log_tail(self, num_bytes: int = 3000) -> str:
        return (
            self.log_path.read_bytes()[-num_bytes:].decode(errors="replace") if self.log_path.exists() else ""
        )

    def weight_version(self) -> str:
        return self.client.weight_version()

    def greedy(self, prompt_token_ids: list[int], max_new_tokens: int = 8) -> list[int]:
        """Greedy token ids for a prompt: a probe of which weights the server serves."""
        reply = self.client.generate(
            list(prompt_token_ids),
            {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
            rid=f"probe-{time.monotonic_ns()}",
            timeout=60.0,
        )
        return [int(entry[1]) for entry in reply["meta_info"]["output_token_logprobs"]]

    def stop(self) -> None:
        stop_servers([self])


def stop_servers(servers: list[SGLangServer]) -> None:
    """SIGKILL each server's process group (the guard leads it: every server process is in it), then
    reap them. A test's own servers need no graceful stop, and SGLang's SIGTERM path sleeps ~5 s
    before it exits; killing all the groups first also stops a pair in the time of one."""
    running = [s for s in servers if s.proc is not None and s.proc.poll() is None]
    for server in running:
        try:
            os.killpg(server.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for server in running:
        server.proc.wait(30.0)


def start_servers(version: str, model_dir: Path, log_dir: Path, count: int) -> list[SGLangServer]:
    """`count` servers started at once, each healthy on return (all stopped if one fails)."""
    servers = [
        SGLangServer(version, model_dir, Path(log_dir) / f"sglang-{version}-{i}.log") for i in range(count)
    ]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_healthy()
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def pair_release_order(item: pytest.Item) -> int:
    """Where a test on the shared pair comes in the suite's order: the newest release's tests first
    (a test parametrized by release asks for that one, any other for the newest)."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return VERSIONS.index(next((p for p in params if p in VERSIONS), NEWEST))


class SharedServerPairs:
    """Two servers of a release shared by every test that only attaches to servers (the session
    fixture `sglang_pair` in tests/conftest.py): a server start costs 30-50 s here, stopping one ~5 s.

    One release's pair is up at a time (a server holds ~2 GB in 3 processes): asking for another
    release stops the pair that is up. A pair with a dead server is started again. Tests sharing a
    pair make no assumption on what a former test left there but what the product resets: each run
    pushes its own weights and versions; conftest runs these tests one after the other and stops the
    pair after the last of them."""

    def __init__(self, model_dir: Path, log_dir: Path):
        self.model_dir = Path(model_dir)
        self.log_dir = Path(log_dir)
        self.version: str | None = None
        self.servers: list[SGLangServer] = []
        self.num_starts = 0

    def pair(self, version: str) -> list[SGLangServer]:
        sglang_venv(version)  # skips (fails on CI) without the install, before stopping anything
        if self.version != version or any(s.proc.poll() is not None for s in self.servers):
            self.stop()
            self.num_starts += 1
            log_dir = self.log_dir / f"start-{self.num_starts}"
            self.servers = start_servers(version, self.model_dir, log_dir, count=2)
            self.version = version
        return self.servers

    def stop(self) -> None:
        stop_servers(self.servers)
        self.servers, self.version = [], None
