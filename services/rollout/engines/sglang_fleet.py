"""The SGLang servers of one engine (sglang.py) and which of them may generate.

A server generates only while it is healthy (the supervisor's health checks, or a call it did
not answer) and serves the current weights: a restarted server serves the checkpoint, and one
that loaded part of a failed update a mix of versions, so either is held out of generation
(`awaiting_weights`) until a whole update reaches it (sglang_weights.py). Each sample goes to the
least-loaded server that may generate. Calls on every server run in turn (pause, memory) or all
at once (weight collectives need every rank inside at the same time).
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rollway.common.log import get_logger
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import EngineError
from rollway.rollout.engines.sglang_http import SGLangHTTPError
from rollway.rollout.engines.sglang_server import ServerProcess, Supervisor, launch_command, launch_env

log = get_logger("rollway.rollout.sglang")
# How often a sample waiting for a servable server looks again.
SERVER_WAIT_SECONDS = 0.2

ServerCall = Callable[[ServerProcess], Any]


def make_servers(config: RolloutConfig) -> list[ServerProcess]:
    """The servers at --sglang-urls as they are, or rollout_num_gpus / rollout_num_gpus_per_engine
    servers to launch on consecutive ports from sglang_port."""
    timeout = config.sglang_request_timeout
    if config.sglang_urls:
        return [ServerProcess(None, url, None, timeout) for url in config.sglang_urls]
    log_dir = Path(config.sglang_log_dir or tempfile.mkdtemp(prefix="rollway-sglang-"))
    env = launch_env(config)
    servers = []
    for i in range(config.rollout_num_gpus // config.rollout_num_gpus_per_engine):
        port = config.sglang_port + i
        url = f"http://{config.sglang_host}:{port}"
        command = launch_command(config, i, port)
        servers.append(ServerProcess(command, url, log_dir / f"server-{i}.log", timeout, env))
    return servers


class ServerFleet:
    """The engine's servers under one supervisor. `weight_version()`: the engine's current
    version (a restart after a push holds the server out); `stopped`: set once the engine stops
    (nothing waits for a server any more)."""

    def __init__(self, config: RolloutConfig, weight_version: Callable[[], int], stopped: threading.Event):
        self.config = config
        self.servers = make_servers(config)
        self.supervisor = Supervisor(
            self.servers,
            startup_timeout=config.sglang_startup_timeout,
            interval=config.sglang_health_interval,
            max_restarts=config.sglang_max_restarts,
            on_restart=self._on_restart,
        )
        self._weight_version = weight_version
        self._stopped = stopped
        self._lock = threading.Lock()
        self._load = {id(s): 0 for s in self.servers}  # calls in flight, by server

    def start(self) -> set[str]:
        """Launch or attach to every server, supervised from now on; the devices they run on."""
        self.supervisor.start()
        devices = set()
        for server in self.servers:
            try:
                devices.add(server.client.device())
            except SGLangHTTPError as exc:
                log.warning(
                    "sglang server does not say its device; assuming cuda", url=server.url, error=str(exc)
                )
                devices.add("cuda")
        return devices

    def stop(self) -> None:
        self.supervisor.stop()

    def _on_restart(self, server: ServerProcess) -> None:
        # A fresh server serves the checkpoint: with pushed weights, that is the wrong policy.
        server.has_sessions = None
        server.weight_version = 0
        if self._weight_version() > 0:
            server.awaiting_weights = True
            log.warning("sglang server restarting; it generates again once it has weight version "
                        f"{self._weight_version()}", url=server.url)  # fmt: skip

    @property
    def num_workers_awaiting_weights(self) -> int:
        tp = self.config.rollout_num_gpus_per_engine
        return tp * sum(s.awaiting_weights for s in self.servers)

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "url": s.url,
                "healthy": s.healthy,
                "restarts": s.num_restarts,
                "restarted": s.restarted,
                "weight_version": s.weight_version,
                "awaiting_weights": s.awaiting_weights,
            }
            for s in self.servers
        ]

    def _servable(self) -> list[ServerProcess]:
        return [s for s in self.servers if s.healthy and not s.awaiting_weights]

    def pick(self, deadline: float) -> ServerProcess:
        """The least-loaded server that is healthy and has the current weights, counted as busy
        until `release`; waits for one while a restart or a weight push is under way (until
        `deadline`)."""
        while True:
            with self._lock:
                servable = self._servable()
                if servable:
                    server = min(servable, key=lambda s: self._load[id(s)])
                    self._load[id(server)] += 1
                    return server
                waiting = [s.url for s in self.servers if s.awaiting_weights]
                # Launched servers are restarted by the supervisor; attached ones come back only
                # with weights pushed to them (awaiting) or not at all as far as we know.
                may_return = waiting or any(s.launched and s.num_restarts < self.supervisor.max_restarts
                                            for s in self.servers)  # fmt: skip
            if self._stopped.is_set() or time.monotonic() >= deadline or not may_return:
                detail = f"; awaiting weights: {waiting}" if waiting else ""
                raise EngineError(f"no healthy sglang server{detail}", retryable=True)
            time.sleep(SERVER_WAIT_SECONDS)

    def release(self, server: ServerProcess) -> None:
        """A call `pick` sent to `server` ended."""
        with self._lock:
            self._load[id(server)] -= 1

    def call_each(self, call: ServerCall, skip_unreachable: bool = False) -> None:
        """`call(server)` on each server in turn. `skip_unreachable`: a server that does not answer
        (killed, restarting) is marked unhealthy and left out; it generates nothing meanwhile, and
        a restarted server waits for the weights before it does (pause and resume need no more)."""
        errors = []
        for server in self.servers:
            try:
                call(server)
            except SGLangHTTPError as exc:
                if skip_unreachable and exc.status == 0:
                    server.healthy = False
                    log.warning("sglang server unreachable; left out", url=server.url, error=str(exc))
                    continue
                errors.append(str(exc))
        if errors:
            raise EngineError("; ".join(errors), retryable=any("no answer" in e for e in errors))

    def call_at_once(self, call: ServerCall, servers: list[ServerProcess] | None = None) -> None:
        """`call(server)` on every server (or `servers`) concurrently: weight collectives need every
        rank inside at the same time (a loop over servers would block in the first server's
        broadcast)."""
        servers = self.servers if servers is None else servers
        if not servers:
            return

        def guarded(server: ServerProcess) -> None:
            server.weight_calls += 1
            try:
                call(server)
            finally:
                server.weight_calls -= 1

        with ThreadPoolExecutor(len(servers)) as pool:
            futures = [pool.submit(guarded, server) for server in servers]
        errors = []
        for future in futures:
            try:
                future.result()
            except SGLangHTTPError as exc:
                errors.append(str(exc))
        if errors:
            raise EngineError("; ".join(errors), retryable=any("no answer" in e for e in errors))

    def wait_until_up(self) -> None:
        """Every server must be up before a group forms (each is a member): a restarting one is
        waited for. Asked afresh, not from the supervisor's last round: a server killed a moment
        ago may still be marked healthy, and a member missing from the rendezvous would leave the
        others blocked in it until the group timeout."""
        deadline = time.monotonic() + self.config.sglang_startup_timeout
        while True:
            down = []
            for server in self.servers:
                if not server.alive() or (server.healthy and not server.client.answers()):
                    # Seen down just now. Only then is the supervisor's flag cleared: clearing it
                    # on a stale read would undo the supervisor marking a restarted server
                    # healthy meanwhile (each answers() of the others can take a second under
                    # load), and the group would wait for it until the deadline.
                    server.healthy = False
                    down.append(server.url)
                elif not server.healthy:  # restarting: the supervisor marks it once it generates
                    down.append(server.url)
            if not down:
                return
            if self._stopped.is_set() or time.monotonic() >= deadline:
                raise EngineError(f"sglang server(s) {down} not healthy", retryable=True)
            time.sleep(SERVER_WAIT_SECONDS)
