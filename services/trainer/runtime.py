"""Rank 0's side of the trainer's ranks: start them, run commands on all of them, stop them.

    start():  store (rank 0 hosts it) -> spawn ranks 1..N-1 -> wait until they reach the store
              -> process group -> TrainerEngine (load + shard, collectives with every rank)
    run(commands):  post commands[1:] to the workers, execute commands[0] here (commands.py).
    shutdown():     post Shutdown, wait for the workers, kill stragglers by pid.

Rank 0's commands all run on one thread of their own (`trainer-compute`), whichever gRPC thread
asked: torch's OpenMP team belongs to the thread that computes, and a step that lands on another
gRPC thread than the last one wakes a second, cold team (measured ~10% slower per SFT step on 2
cores, bench/trainer_step_cpu.py).

A worker that died, or a command that failed half-way on several ranks, leaves the ranks out of
step: the runtime is then `broken` and every later command fails fast with the reason (health
goes NOT_SERVING through the `on_broken` callback) instead of hanging in a collective.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch.distributed as dist

from rollway.common.errors import FailedPrecondition, Unavailable
from rollway.common.log import get_logger
from rollway.common.tracing import in_current_context
from rollway.trainer.commands import Command, Shutdown, command_name, execute
from rollway.trainer.config import TrainerConfig
from rollway.trainer.distributed import CommandChannel, command_key, create_store, init_process_group
from rollway.trainer.engine import TrainerEngine
from rollway.trainer.ranks import WorkerRanks

log = get_logger("rollway.trainer.runtime")


# After a command fails on rank 0, how long to wait for a worker that failed with it to say why
# (its error in the store, then its exit). A failure of rank 0 alone waits this long in vain.
WORKER_REASON_SECONDS = 2.0


class RankRuntime:
    """The process group, the worker processes and rank 0's engine."""

    def __init__(
        self, config: TrainerConfig, on_broken: Callable[[str], None] | None = None, auth_token: str = ""
    ):
        self.config = config
        self.on_broken = on_broken or (lambda reason: None)
        self.broken: str | None = None
        timeout = config.distributed_timeout_seconds
        self.store = create_store(0, config.world_size, config.master_addr, config.master_port, timeout)
        self.workers = WorkerRanks(config, config.master_addr, self.store.port, auth_token)
        self.channel = CommandChannel(self.store, 0, command_key(auth_token))
        self.engine: TrainerEngine | None = None
        self._watch = threading.Event()
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="trainer-compute")

    def start(self) -> TrainerEngine:
        """Join the group with the workers and build rank 0's shard (blocks while loading)."""
        return self._compute.submit(in_current_context(self._start)).result()

    def _start(self) -> TrainerEngine:
        self._wait_for_workers()
        info = init_process_group(
            self.store, 0, self.config.world_size, self.config.distributed_timeout_seconds
        )
        self.engine = TrainerEngine(self.config, info)
        threading.Thread(target=self._watch_workers, name="trainer-rank-watch", daemon=True).start()
        return self.engine

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.config.distributed_timeout_seconds
        for rank in range(1, self.config.world_size):
            while not self.store.check([f"ready/{rank}"]):
                self._raise_if_dead()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"trainer rank {rank} did not start within the distributed timeout")
                time.sleep(0.05)

    def _worker_failure(self, timeout_s: float) -> str | None:
        """The reason of a worker that failed or died, waiting up to `timeout_s` for one: a worker
        that failed leaves its error in the store, then exits (worker.py)."""
        deadline = time.monotonic() + timeout_s
        while True:
            reason = self._dead_reason()
            if reason or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # polling the processes and the store, not a fixed delay
        if reason:
            return reason
        for rank in range(1, self.config.world_size):  # reported, but still exiting
            error = self.channel.read_error(rank)
            if error:
                return f"trainer rank {rank} failed: {error.splitlines()[0]}"
        return None

    def _dead_reason(self) -> str | None:
        dead = self.workers.dead()
        if not dead:
            return None
        rank, code = min(dead.items())
        error = self.channel.read_error(rank)
        return f"trainer rank {rank} exited with code {code}" + (
            f": {error.splitlines()[0]}" if error else ""
        )

    def _raise_if_dead(self) -> None:
        reason = self._dead_reason()
        if reason:
            raise RuntimeError(reason)

    def _watch_workers(self) -> None:
        while not self._watch.wait(1.0):
            reason = self._dead_reason()
            if reason and not self.broken:
                self._mark_broken(reason)

    def _mark_broken(self, reason: str) -> None:
        if self.broken:
            return
        self.broken = reason
        log.error("trainer ranks broken", reason=reason)
        self.on_broken(reason)

    def run(self, commands: list[Command]) -> Any:
        """Run commands[r] on rank r, for every rank; rank 0's result is returned."""
        if self.engine is None:
            raise Unavailable("the trainer is still loading the model")
        if self.broken:
            raise FailedPrecondition(
                f"the trainer's ranks are out of service ({self.broken}); restart the trainer"
            )
        reason = self._dead_reason()
        if reason:
            self._mark_broken(reason)
            raise FailedPrecondition(
                f"the trainer's ranks are out of service ({reason}); restart the trainer"
            )
        return self._compute.submit(in_current_context(self._run_here), commands).result()

    def _run_here(self, commands: list[Command]) -> Any:
        assert self.engine is not None
        self.channel.send(commands)
        name = command_name(commands[0])
        try:
            return execute(self.engine, commands[0])
        except Exception as exc:
            log.exception("command failed on rank 0", command=name)
            if self.config.world_size > 1:
                reason = self._worker_failure(WORKER_REASON_SECONDS) or (
                    f"{name} failed on rank 0: {type(exc).__name__}: {exc}"
                )
                self._mark_broken(reason)
                raise Unavailable(f"{name} failed: {reason}") from exc
            raise

    def shutdown(self, timeout_s: float = 15.0) -> None:
        """Stop the workers (by command, then by pid) and leave the process group."""
        self._watch.set()
        posted = False
        try:
            if not self.broken and self.engine is not None:
                self.channel.send([Shutdown()] * self.config.world_size)
                posted = True
        except Exception:  # the store may already be unusable; the pids are what count
            log.warning("could not post shutdown to the ranks")
        self.workers.wait(timeout_s if posted else 0.5)
        self.workers.kill()
        # A command still running (its ranks gone) must not hold up the shutdown.
        self._compute.shutdown(wait=False, cancel_futures=True)
        if dist.is_initialized():
            dist.destroy_process_group()
        log.info("trainer ranks stopped")
