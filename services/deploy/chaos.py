"""Fault injection for chaos tests and soak benchmarks: kill -9 (or freeze, SIGSTOP) the services
of a local `rollway run` at seeded random moments, one failure at a time, and time each recovery.

    run = run_with_chaos(config, run_dir, [Kill(1, "trainer"), Kill(3, "coordinator")], seed=7,
                         log_path=workdir / "launcher.log")      # `rollway run CONFIG`, to its end
    Kill(2, "rollout", signal.SIGSTOP)   a frozen service: the coordinator's hang watch must kill it
    Kill(2, "trainer.worker")            rank 1 of a 2-rank trainer (python -m rollway.trainer.worker)
    run.returncode  0
    run.kills       [KillRecord(service="trainer", pid=..., steps_logged=1, replaced_seconds=0.2,
                                next_step_seconds=6.0, ...), ...]
    random_schedule(16, 36, seed=1)   kills at distinct random steps, now and then the coordinator

Used by tests/e2e/test_chaos.py and bench/bench_soak.py.

The services of a `rollway run` are the launcher's descendants (the coordinator is its child, the
others are the coordinator's), found through /proc (Linux). A kill is due once the run has logged
`after_step` steps; it comes after a seeded random delay of up to one step's time (so it lands
during generation, training, weight sync or checkpointing). The harness then waits for the
replacement process and for a step the run logs after it appeared before the next kill, so the run
makes progress between kills and recovers from one failure at a time.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SERVICES = ("trainer", "rollout", "dataloader", "coordinator")
POLL_SECONDS = 0.05
DEFAULT_STEP_SECONDS = 0.5  # the delay bound before the run has logged two steps


@dataclass(frozen=True)
class Kill:
    """Send `signum` to `service` once the run has logged `after_step` steps: SIGKILL (a crash) or
    SIGSTOP (a freeze, which only the coordinator's hang watch ends, by killing it)."""

    after_step: int
    service: str
    signum: int = signal.SIGKILL


@dataclass(frozen=True)
class FillDisk:
    """Fill the filesystem holding `path` (a real ENOSPC for what the run writes there, e.g. its
    checkpoints) once the run has logged `after_step` steps; free it once `steps_full` more are."""

    after_step: int
    path: Path
    steps_full: int = 2
    service: str = "disk"
    signum: int = 0


FILLER_NAME = ".chaos-disk-filler"


class NoSmallDisk(RuntimeError):
    """A small disk cannot be mounted here (not root, or mounts are not allowed); says why."""


@contextmanager
def small_disk(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of `size_bytes` mounted at `path`, a real disk that fills up (ENOSPC from the
    kernel); unmounted on exit. Raises NoSmallDisk where it cannot be mounted."""
    if os.geteuid() != 0:
        raise NoSmallDisk("a real full disk needs a tmpfs mount, which needs root")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        raise NoSmallDisk(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@dataclass
class KillRecord:
    """One kill -9 and what followed (times in seconds from the kill; None: it never came)."""

    service: str
    pid: int
    signum: int
    steps_logged: int  # distinct steps in metrics.jsonl when it was killed
    delay_seconds: float  # the injected delay after the kill was due
    killed_at: float  # time.time() of the kill
    replaced_seconds: float | None = None  # a new process of the service appeared
    next_step_seconds: float | None = None  # the run logged a step after the replacement appeared


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid` (children, theirs, ...), with its command line (Linux /proc)."""
    found: dict[int, str] = {}
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
            for child in children:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_text().replace("\0", " ").strip()
                except (FileNotFoundError, ProcessLookupError):
                    continue
                pending.append(child)
    return found


def service_pid(launcher_pid: int, service: str) -> int | None:
    """The pid of the `python -m rollway.<service>` process below the launcher, if one runs."""
    for pid, cmd in descendants(launcher_pid).items():
        if f"-m rollway.{service} " in cmd + " ":
            return pid
    return None


def metrics_lines(run_dir: Path) -> list[str]:
    path = Path(run_dir) / "metrics.jsonl"
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def steps_logged(run_dir: Path) -> int:
    """Distinct steps in RUN_DIR/metrics.jsonl."""
    return len({json.loads(line)["step"] for line in metrics_lines(run_dir)})


def step_seconds(run_dir: Path) -> float:
    """A normal step's wall time: the shortest gap between two step records so far (the first
    steps after a recovery are slower, and a delay as long as those would skip steps)."""
    times = [json.loads(line).get("time") for line in metrics_lines(run_dir)]
    gaps = [
        b - a for a, b in zip(times, times[1:], strict=False) if a is not None and b is not None and b > a
    ]
    return min(gaps) if gaps else DEFAULT_STEP_SECONDS


def random_schedule(
    num_kills: int, num_steps: int, seed: int, coordinator_share: float = 0.15, freeze_share: float = 0.0
) -> list[Kill]:
    """`num_kills` faults at distinct seeded random steps in [1, num_steps - 2] (each is followed
    by a step before the next one: there is room for all of them): the trainer, rollout or
    dataloader service, and the coordinator with probability `coordinator_share`; a service other
    than the coordinator is frozen (SIGSTOP) instead of killed with probability `freeze_share`."""
    if num_kills > num_steps - 2:
        raise ValueError(f"{num_kills} kills need a run of at least {num_kills + 2} steps, not {num_steps}")
    rng = random.Random(seed)
    steps = sorted(rng.sample(range(1, num_steps - 1), num_kills))
    schedule = []
    for step in steps:
        service = "coordinator" if rng.random() < coordinator_share else rng.choice(SERVICES[:3])
        freeze = freeze_share > 0 and service != "coordinator" and rng.random() < freeze_share
        schedule.append(Kill(step, service, signal.SIGSTOP if freeze else signal.SIGKILL))
    return schedule


class ChaosHarness(threading.Thread):
    """Kills the scheduled services of a run, one failure at a time (see the module docstring)."""

    def __init__(
        self,
        launcher: subprocess.Popen,
        run_dir: Path,
        schedule: list[Kill | FillDisk],
        seed: int,
        deadline_seconds: float = 600.0,
    ):
        super().__init__(daemon=True, name="chaos")
        self.launcher, self.run_dir, self.schedule = launcher, Path(run_dir), list(schedule)
        self.random = random.Random(seed)
        self.deadline = time.monotonic() + deadline_seconds
        self.kills: list[KillRecord] = []
        self.error: str | None = None  # why a scheduled kill did not happen

    def _running(self) -> bool:
        return self.launcher.poll() is None and time.monotonic() < self.deadline

    def run(self) -> None:
        for kill in self.schedule:
            if isinstance(kill, FillDisk):
                if not self._wait_steps(kill.after_step):
                    self.error = f"the run ended before the disk could be filled after step {kill.after_step}"
                    return
                self._fill_and_follow(kill)
                continue
            while steps_logged(self.run_dir) < kill.after_step or self._pid(kill.service) is None:
                if not self._running():
                    self.error = (
                        f"the run ended before {kill.service} could be killed after step {kill.after_step}"
                    )
                    return
                time.sleep(POLL_SECONDS)
            delay = self.random.uniform(0.0, step_seconds(self.run_dir))  # the injected moment
            time.sleep(delay)
            pid = self._pid(kill.service)
            if pid is None:
                self.error = f"{kill.service} was gone when it was to be killed after step {kill.after_step}"
                return
            self._kill_and_follow(kill.service, pid, kill.signum, delay)

    def _pid(self, service: str) -> int | None:
        return service_pid(self.launcher.pid, service)

    def _wait_steps(self, count: int) -> bool:
        while steps_logged(self.run_dir) < count:
            if not self._running():
                return False
            time.sleep(POLL_SECONDS)
        return True

    def _fill_and_follow(self, fill: FillDisk) -> None:
        """Fill the disk, let the run go on full for `steps_full` steps, free it; the record's
        replaced_seconds is when it was freed, next_step_seconds a step logged after that."""
        filler = Path(fill.path) / FILLER_NAME
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            chunk = b"\0" * (1 << 20)
            while True:
                os.write(fd, chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        started = time.monotonic()
        record = KillRecord("disk", 0, 0, steps_logged(self.run_dir), 0.0, time.time())
        self.kills.append(record)
        self._wait_steps(record.steps_logged + fill.steps_full)
        filler.unlink()
        record.replaced_seconds = time.monotonic() - started
        seen = set(metrics_lines(self.run_dir))
        while not set(metrics_lines(self.run_dir)) - seen:
            if not self._running():
                return
            time.sleep(POLL_SECONDS)
        record.next_step_seconds = time.monotonic() - started

    def _kill_and_follow(self, service: str, pid: int, signum: int, delay: float) -> None:
        os.kill(pid, signum)
        started = time.monotonic()
        record = KillRecord(service, pid, signum, steps_logged(self.run_dir), delay, time.time())
        self.kills.append(record)
        # The replacement, then a step record that was not there when it appeared (a step in
        # flight may still be logged before the death is noticed; a redone step replaces its
        # record with a new one).
        while self._pid(service) in (None, pid):
            if not self._running():
                return
            time.sleep(POLL_SECONDS)
        record.replaced_seconds = time.monotonic() - started
        seen = set(metrics_lines(self.run_dir))
        while not set(metrics_lines(self.run_dir)) - seen:
            if not self._running():
                return
            time.sleep(POLL_SECONDS)
        record.next_step_seconds = time.monotonic() - started


@dataclass
class ChaosRun:
    """How a `rollway run` under the harness ended."""

    returncode: int | None  # None: it outlived its deadline and was killed
    seconds: float  # launch to exit
    kills: list[KillRecord]
    error: str | None  # why a scheduled kill did not happen


def run_with_chaos(
    config: Path,
    run_dir: Path,
    schedule: list[Kill | FillDisk],
    seed: int,
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    timeout_seconds: float = 600.0,
) -> ChaosRun:
    """`rollway run CONFIG` (output to `log_path`) while the harness kills its services; waits for
    the launcher to exit (it is killed, by pid, past `timeout_seconds`). `run_dir` is the run's
    directory (RUN_DIR/metrics.jsonl)."""
    started = time.monotonic()
    with Path(log_path).open("w") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "rollway.cli", "run", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    harness = ChaosHarness(launcher, run_dir, schedule, seed, deadline_seconds=timeout_seconds)
    harness.start()
    try:
        code: int | None = launcher.wait(timeout_seconds)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
    harness.join(10)
    return ChaosRun(code, time.monotonic() - started, harness.kills, harness.error)
