"""What watches a run's services, all in one place: exits (the service group's `dead()`), failed
health checks of attached services (HealthWatch), and hangs (HangWatch, which tells a hung
service from a slow one); RunWatch ties them together and decides what each means for the run.

RunWatch(record, restart_environment) ticks every WATCH_SECONDS: a dead service cancels the run's
calls in flight, so that the run fails naming it (or recovers: run_loop.py) instead of waiting; a
hung one the run started is killed first and then recovers like a dead one; an attached one is
only named. A dead environment the run started is restarted on its port while the run goes on.

HealthWatch watches services the coordinator did not start (attached by address): one that stops
answering its health checks for grace_seconds is reported dead like one that exited. Its `http`
services (an OpenEnv server) are checked by GET /health instead of grpc.health.v1.

HangWatch tells a hung service from a slow one, by asking every service of a run for its progress.

    watch = HangWatch(addresses, hung_service_seconds=0.0)   # 0: thresholds from call durations
    watch.poll()      each tick: a GetProgress to every service whose last one has come back
    watch.hung()      the first hung service (a DeadService naming it and why), or None
    watch.suspect_seconds()  how long until a service silent now would be declared hung

A process that dies is seen by its exit; one that hangs is not. A frozen process (SIGSTOP, a
stuck kernel) answers nothing; a deadlocked thread leaves the gRPC threads answering while its
call goes quiet. So a service is hung when

  - it has answered no GetProgress for longer than its threshold (frozen), or
  - it answers, but a watched call of it (TrainStep, Generate, a weight update, a checkpoint)
    has made no progress for longer than the threshold, and no other service is frozen: a frozen
    peer explains a quiet collective (the trainer's broadcast waits on a frozen rollout). Of
    several quiet calls, the one quiet longest is blamed.

Threshold: hung_service_seconds when set; otherwise 10x the median of the call's recent
durations (the service reports them), at least MIN_HUNG_SECONDS, so a 0.6B model's 15 s step and
a toy's 0.1 s step both get a bound that a normal step never reaches (FIRST_CALL_HUNG_SECONDS for
a kind of call none of which has completed yet).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from rollway.common.client import ClientConfig, open_channel
from rollway.common.log import get_logger
from rollway.common.supervision.supervisor import DeadService
from rollway.common.v1 import progress_pb2, progress_pb2_grpc

if TYPE_CHECKING:
    from rollway.coordinator.run_record import RunRecord

log = get_logger("rollway.coordinator.watch")
WATCH_SECONDS = 0.5
# After a failed call, how long to wait for the watcher to name a service that is dying.
DEAD_GRACE_SECONDS = 3.0

MIN_HUNG_SECONDS = 60.0
# A kind of call that never completed yet has no usual duration: its first one (a big model's
# first step, with warm-up) may be long with no beat inside one micro-batch, so it gets longer.
FIRST_CALL_HUNG_SECONDS = 600.0
DURATION_FACTOR = 10.0
PROBE_SECONDS = 2.0  # a GetProgress answers from counters: two seconds is an eternity for it
WATCH_SLACK_SECONDS = 1.0  # a health check's own timeout: silence shorter than this is no sign


class HealthWatch:
    """Reports an attached service dead once its health checks fail for `grace_seconds`."""

    def __init__(
        self,
        addresses: dict[str, list[str]],
        client_config: ClientConfig | None = None,
        grace_seconds: float = 5.0,
        http: frozenset[str] = frozenset(),
    ):
        from grpc_health.v1 import health_pb2_grpc

        self.grace_seconds = grace_seconds
        self.http = http
        self._channels: list[grpc.Channel] = []
        self._targets = []
        for name, group in addresses.items():
            for index, address in enumerate(group):
                channel = open_channel(address, client_config)
                self._channels.append(channel)
                self._targets.append((name, index, address, health_pb2_grpc.HealthStub(channel)))
        self._last_ok = {(name, index): time.monotonic() for name, index, _, _ in self._targets}

    def restarted(self, name: str, index: int) -> None:
        """A new process answers at the address now: its grace starts over."""
        self._last_ok[(name, index)] = time.monotonic()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def suspect_seconds(self) -> float:
        """How long until a service whose health checks fail now would be reported (0: none fails)."""
        now = time.monotonic()
        silent = [now - last for last in self._last_ok.values() if now - last > 2 * WATCH_SLACK_SECONDS]
        return max([0.0, *(self.grace_seconds - s + WATCH_SLACK_SECONDS for s in silent)])

    def dead(self) -> DeadService | None:
        from grpc_health.v1 import health_pb2

        now = time.monotonic()
        for name, index, address, stub in self._targets:
            try:
                if name in self.http:
                    with urllib.request.urlopen(f"http://{address}/health", timeout=1.0) as reply:
                        reply.read()
                else:
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                self._last_ok[(name, index)] = now
            except (grpc.RpcError, OSError) as exc:  # urllib's errors are OSErrors
                silent = now - self._last_ok[(name, index)]
                if silent > self.grace_seconds:
                    why = exc.code().name if isinstance(exc, grpc.RpcError) else type(exc).__name__
                    return DeadService(
                        name,
                        index,
                        f"at {address} is unreachable: no health check answered for {silent:.0f}s ({why})",
                    )
        return None


@dataclass
class _Target:
    name: str
    index: int
    address: str
    stub: progress_pb2_grpc.ProgressServiceStub
    progress: progress_pb2.GetProgressResponse | None = None
    in_flight: grpc.Future | None = None
    # When the oldest probe that no answer has followed was sent (None: the last one answered).
    # Silence is counted from there, so a pause in probing (a busy watch loop) blames nobody.
    unanswered_since: float | None = None


class HangWatch:
    def __init__(
        self,
        addresses: dict[str, list[str]],
        hung_service_seconds: float = 0.0,
        client_config: ClientConfig | None = None,
    ):
        self.hung_service_seconds = hung_service_seconds
        self._lock = threading.Lock()
        self._channels: list[grpc.Channel] = []
        self._targets: list[_Target] = []
        now = time.monotonic()  # a service that never answers is silent from the start
        for name, group in addresses.items():
            for index, address in enumerate(group):
                channel = open_channel(address, client_config)
                self._channels.append(channel)
                stub = progress_pb2_grpc.ProgressServiceStub(channel)
                self._targets.append(_Target(name, index, address, stub, unanswered_since=now))

    def restarted(self, name: str, index: int, address: str) -> None:
        """A new process serves instance `index` of `name` (at `address`): its silence starts over."""
        for target in self._targets:
            if (target.name, target.index) == (name, index):
                if address != target.address:
                    channel = open_channel(address)
                    self._channels.append(channel)
                    target.stub = progress_pb2_grpc.ProgressServiceStub(channel)
                    target.address = address
                target.unanswered_since, target.progress, target.in_flight = time.monotonic(), None, None

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    # --- probing ---
    def poll(self) -> None:
        """Ask every service whose last GetProgress has come back (never waits)."""
        now = time.monotonic()
        for target in self._targets:
            if target.in_flight is None:
                if target.unanswered_since is None:
                    target.unanswered_since = now
                future = target.stub.GetProgress.future(
                    progress_pb2.GetProgressRequest(), timeout=PROBE_SECONDS
                )
                target.in_flight = future
                future.add_done_callback(lambda f, t=target: self._answered(t, f))

    def _answered(self, target: _Target, future: grpc.Future) -> None:
        with self._lock:
            if target.in_flight is not future:
                return  # a probe of a process since replaced
            target.in_flight = None
            try:
                target.progress = future.result()
            except grpc.RpcError:
                return  # silent: unanswered_since stays
            target.unanswered_since = None

    # --- judging ---
    def _threshold(self, progress: progress_pb2.GetProgressResponse | None, method: str = "") -> float:
        if self.hung_service_seconds > 0:
            return self.hung_service_seconds
        medians = progress.median_seconds if progress is not None else {}
        if method and method not in medians:
            return FIRST_CALL_HUNG_SECONDS
        if method:
            typical = medians[method]
        else:  # frozen (it answers nothing): sized by its slowest kind of call
            typical = max(medians.values(), default=0.0)
        return max(MIN_HUNG_SECONDS, DURATION_FACTOR * typical)

    def _frozen_for(self, target: _Target, now: float) -> float:
        return now - target.unanswered_since if target.unanswered_since is not None else 0.0

    def hung(self) -> DeadService | None:
        now = time.monotonic()
        with self._lock:
            targets = list(self._targets)
        for target in targets:
            silent = self._frozen_for(target, now)
            threshold = self._threshold(target.progress)
            if silent > threshold:
                pid = f"pid {target.progress.pid}, " if target.progress is not None else ""
                return DeadService(
                    target.name,
                    target.index,
                    f"({pid}at {target.address}) is hung: it answered nothing for {silent:.0f}s "
                    f"(frozen? hung_service_seconds {threshold:.0f}s)",
                )
        if any(self._frozen_for(t, now) > 2 * PROBE_SECONDS for t in targets):
            return None  # a frozen peer may be why the others' calls are quiet: judged first
        quiet = [
            (call.silent_seconds, target, call)
            for target in targets
            if target.progress is not None
            for call in target.progress.calls
            if call.silent_seconds > self._threshold(target.progress, call.method)
        ]
        if not quiet:
            return None
        silent, target, call = max(quiet, key=lambda q: q[0])
        return DeadService(
            target.name,
            target.index,
            f"(pid {target.progress.pid}) is hung: its {call.method} made no progress for {silent:.0f}s "
            f"(running {call.running_seconds:.0f}s; hung_service_seconds "
            f"{self._threshold(target.progress, call.method):.0f}s)",
        )

    def suspect_seconds(self) -> float:
        """The longest time until a service that is silent now would be declared hung (0: none is)."""
        now = time.monotonic()
        with self._lock:
            targets = list(self._targets)
        waits = [
            self._threshold(t.progress) - self._frozen_for(t, now)
            for t in targets
            if self._frozen_for(t, now) > 2 * PROBE_SECONDS
        ]
        return max([0.0, *waits])


class RunWatch:
    """Watches a run's services; a dead one cancels the run's calls so that it ends at once."""

    def __init__(
        self, record: RunRecord, restart_environment: Callable[[DeadService, HealthWatch | None], bool]
    ):
        self.record = record
        # The run's own recovery (run_loop.py) restarts a dead environment it started.
        self.restart_environment = restart_environment
        # Attached services by their health checks; the environment the run started also (its
        # process may live on, hung, while a dead one is seen at once by group.dead()).
        watched = {
            name: addresses
            for name, addresses in record.addresses.items()
            if record.group is None or name not in record.group.addresses or name == "environment"
        }
        # An OpenEnv server (openenv_app) answers HTTP: GET /health, and no GetProgress (its calls
        # are bounded by the rollout's environment_step_timeout; a frozen one fails /health).
        http = frozenset({"environment"}) if record.run.environment_module else frozenset()
        self.health = HealthWatch(watched, http=http) if any(watched.values()) else None
        # Every service, started or attached: a hung one is found by its progress (HangWatch above).
        progress = {name: addresses for name, addresses in record.addresses.items() if name not in http}
        self.hang = HangWatch(progress, record.config.hung_service_seconds)
        self._unreachable_named: tuple[str, int] | None = None  # named once per spell
        self.unreachable_seen: set[tuple[str, int]] = set()  # cut off at some time in this attempt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watch-{record.run_id}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            record = self.record
            self.hang.poll()
            self._note_unreachable()
            dead = (
                (record.group.dead() if record.group else None)
                or (self.health.dead() if self.health else None)
                or self._hung()
            )
            if dead is not None and not record.finished:
                if dead.name == "environment" and self.restart_environment(dead, self.health):
                    self.hang.restarted(dead.name, dead.index, record.addresses[dead.name][dead.index])
                    continue
                record.dead = dead
                log.error("service died", service=str(dead).splitlines()[0])
                if record.services is not None:
                    record.services.cancel_all(dead=(dead.name, dead.index))
                return

    def _note_unreachable(self) -> None:
        group = self.record.group
        if group is None:
            return
        for name, addresses in group.addresses.items():
            for index in range(len(addresses)):
                if group.unreachable(name, index):
                    self.unreachable_seen.add((name, index))

    def _hung(self) -> DeadService | None:
        """A hung service, killed (SIGKILL) when the run started it: then it is dead like any other
        and recovers the same way. An attached one is only named: the run fails."""
        hung = self.hang.hung()
        group = self.record.group
        if hung is None or group is None or hung.name not in group.addresses:
            return hung
        cut_off = group.unreachable(hung.name, hung.index)
        if cut_off is not None:  # not frozen: its node is cut off; Ray's verdict decides
            if self._unreachable_named != (hung.name, hung.index):
                self._unreachable_named = (hung.name, hung.index)
                log.warning("service unreachable: not killed", service=f"{hung.name}_{hung.index}",
                            why=cut_off)  # fmt: skip
                self.record.notice(f"{hung.name}_{hung.index} unreachable: {cut_off}")
            return None
        self._unreachable_named = None
        log.error("service hung: killing it", service=str(hung))
        group.kill(hung.name, hung.index)
        return DeadService(hung.name, hung.index, f"{hung.detail}; killed (SIGKILL)")

    def wait_for_dead(self) -> DeadService | None:
        """A call failed: the service behind it may be dying, or frozen. Its name, once the watch
        can tell: an exit is seen within DEAD_GRACE_SECONDS; a silent service (failing health
        checks, answering no progress probe) is waited for until the watch judges it."""
        deadline = time.monotonic() + DEAD_GRACE_SECONDS
        while self.record.dead is None and self._thread.is_alive():
            pending = max(
                self.hang.suspect_seconds(),
                self.health.suspect_seconds() if self.health else 0.0,
                self.record.group.verdict_pending_seconds() if self.record.group else 0.0,
            )
            if time.monotonic() >= deadline and pending <= 0:
                break
            time.sleep(0.1)
        return self.record.dead

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.hang.close()
        if self.health is not None:
            self.health.close()
