"""Runs reward functions on a thread pool with a per-call timeout; failures mark samples.

    score(reward, samples, done) ─> pool thread: fn(...) ──┐
                                    watchdog: deadline ────┴─> done(rewards, error)  (first one wins)

A reward that raises, returns a non-number, or runs past --reward-timeout gives reward 0 and an
error message for its samples; the batch carries on. A timed-out call cannot be killed: it keeps
its pool thread until it returns (counted in num_timeouts), so a reward that hangs forever
slowly takes the pool's threads.
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable

from rollway.common.log import get_logger
from rollway.rollout.rewards.types import RewardFunction, RewardSample

log = get_logger("rollway.rollout.rewards")

Done = Callable[[list[float], str], None]


class Watchdog:
    """One thread that fires callbacks at deadlines (cheaper than a Timer thread per call)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cond = threading.Condition()
        self._counter = itertools.count()
        threading.Thread(target=self._run, name="reward-watchdog", daemon=True).start()

    def at(self, deadline: float, callback: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._counter), callback))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, callback = heapq.heappop(self._heap)
            callback()


def _as_reward(value: object) -> float:
    if isinstance(value, bool):
        return float(value)
    try:
        reward = float(value)  # int, float, numpy and torch scalars
    except (TypeError, ValueError):
        raise TypeError(f"reward must be a number, got {type(value).__name__}") from None
    if not math.isfinite(reward):
        raise ValueError(f"reward is not finite ({reward})")
    return reward


def call_reward(reward: RewardFunction, samples: list[RewardSample]) -> list[float]:
    """Run `reward` on `samples` (one call for a group reward, one per sample otherwise)."""

    def run(arg):
        out = reward.fn(arg)
        return asyncio.run(out) if inspect.isawaitable(out) else out

    if not reward.group:
        return [_as_reward(run(sample)) for sample in samples]
    values = run(list(samples))
    if not isinstance(values, list | tuple) or len(values) != len(samples):
        raise ValueError(f"group reward must return {len(samples)} rewards, got {str(values)[:100]}")
    return [_as_reward(v) for v in values]


class DaemonPool:
    """Worker threads that never hold up process exit (a hung reward must not block shutdown,
    which concurrent.futures' pool would: it joins its threads at exit)."""

    def __init__(self, num_workers: int):
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        for i in range(num_workers):
            threading.Thread(target=self._work, name=f"reward-{i}", daemon=True).start()

    def submit(self, task: Callable[[], None]) -> None:
        self._tasks.put(task)

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except Exception:
                log.exception("reward task failed")

    def shutdown(self, num_workers: int) -> None:
        for _ in range(num_workers):
            self._tasks.put(None)


class RewardRunner:
    """Worker pool plus watchdog; counts errors and timeouts."""

    def __init__(self, num_workers: int, timeout: float):
        self.timeout = timeout
        self.num_workers = num_workers
        self._pool = DaemonPool(num_workers)
        self._watchdog = Watchdog()
        self._lock = threading.Lock()
        self.num_errors = 0
        self.num_timeouts = 0

    def score(self, reward: RewardFunction, samples: list[RewardSample], done: Done) -> None:
        """Compute rewards for `samples`; `done(rewards, error)` is called exactly once."""
        settled = threading.Event()
        settle_lock = threading.Lock()

        def settle(rewards: list[float], error: str, counter: str = "") -> None:
            with settle_lock:
                if settled.is_set():
                    return
                settled.set()
            if counter:
                with self._lock:
                    setattr(self, counter, getattr(self, counter) + 1)
                log.warning(
                    "reward failed", reward=reward.name, error=error, indices=[s.index for s in samples]
                )
            done(rewards, error)

        def work() -> None:
            if settled.is_set():
                return
            limit = f"reward {reward.name} timed out after {self.timeout:g}s"
            self._watchdog.at(
                time.monotonic() + self.timeout, lambda: settle([0.0] * len(samples), limit, "num_timeouts")
            )
            try:
                rewards = call_reward(reward, samples)
            except Exception as exc:
                settle(
                    [0.0] * len(samples),
                    f"reward {reward.name} failed: {type(exc).__name__}: {exc}"[:500],
                    "num_errors",
                )
            else:
                settle(rewards, "")

        self._pool.submit(work)

    def shutdown(self) -> None:
        self._pool.shutdown(self.num_workers)
