"""Where a run's services come from, and how they are watched: one interface for every launcher.

    group = LocalServiceGroup(workdir)          local processes on loopback ports (bare: each is
    group.start({"trainer": 1, "rollout": 2})   configured by the run's Init; an "environment" is
                                                served with its flags from `args`, by an HTTP server
                                                where `http_services` names its module), in parallel
    group.addresses   {"trainer": [A], "rollout": [B, C]}
    group.dead()      the first service found dead, with the tail of its log (None while all live)
    group.restart("rollout", 1)                 a new process in place of a dead one: its address
    group.restart_in_place("environment", 0)    ... bound to the dead one's port (clients reconnect)
    group.kill("trainer", 0)  SIGKILL a hung one (its process group): it is then dead like any other
    group.stop()      every process, by its own pid (and its process group)

The services append their spans to this process's trace file, if it has one (--trace-file or
ROLLWAY_TRACE_FILE): a run's trace file holds the services' side of every call too.

RayServiceGroup (ray_services.py) is the same interface over Ray actors. A group that cannot
restart a service raises CannotRestart, and the run fails naming the dead service.

What a death, a failed health check or a hang means for a run is the coordinator's
(coordinator/watch.py): this module only starts, restarts, kills and reports exits.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rollway.common.process_exit import describe_exit
from rollway.common.supervision.service_process import ServiceProcess
from rollway.common.tracing import trace_file_environment

TAIL_LINES = 30
# Services whose module is not rollway.<name>.
SERVICE_MODULES = {"environment": "rollway.environment"}


@dataclass(frozen=True)
class DeadService:
    """A service found dead: which one, and what is known about why."""

    name: str
    index: int
    detail: str

    def __str__(self) -> str:
        label = self.name if self.index == 0 else f"{self.name}_{self.index}"
        return f"{label} {self.detail}"


class CannotRestart(RuntimeError):
    """This group cannot put a new instance in place of a dead one; the message says why."""


class ReplacementDied(RuntimeError):
    """The new instance died while it was being started (its node was lost meanwhile, before Ray
    had said so): that counts as one more restart, if the run has one left."""

    def __init__(self, dead: DeadService):
        super().__init__(str(dead))
        self.dead = dead


class ServiceGroup(ABC):
    """Services a run started (local processes, Ray actors): addresses, death, restart, stop."""

    addresses: dict[str, list[str]]

    def placement_settings(self) -> dict[str, object]:
        """Run settings the placement decided (where the weight group meets, ...), which the run
        uses and pushes to its services in place of its own; none for local processes."""
        return {}

    @abstractmethod
    def start(self, counts: dict[str, int]) -> dict[str, list[str]]:
        """Start `counts[name]` instances of each service; their addresses."""

    @abstractmethod
    def dead(self) -> DeadService | None:
        """The first service found dead (None while all live)."""

    @abstractmethod
    def restart(self, name: str, index: int) -> str:
        """A new instance in place of instance `index` of `name`; its address (CannotRestart)."""

    def rebuilt_by_restart(self) -> set[str]:
        """Services that cannot rebuild their state in place for a recovering run, so a recovery
        restarts them with whichever service died (a Ray trainer whose ranks are actors of their
        own: rank 0 cannot start them again)."""
        return set()

    def unreachable(self, name: str, index: int) -> str | None:
        """Why instance `index` of `name` cannot be reached now, when its host (a cluster node)
        is cut off: it is then not frozen, and must not be killed for silence. None on one machine."""
        return None

    def settle(self, name: str, index: int) -> DeadService | None:
        """After instance `index` of `name` answers again from a cut-off spell: its death, where
        the cluster still declares its host lost for that spell (None: it lives on)."""
        return None

    def verdict_pending_seconds(self) -> float:
        """How long a verdict on an unreachable service may still take (0: none is unreachable)."""
        return 0.0

    @abstractmethod
    def kill(self, name: str, index: int) -> None:
        """SIGKILL instance `index` of `name` (a hung one: a frozen process ignores SIGTERM)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every service of the group."""


class LocalServiceGroup(ServiceGroup):
    """Services as child processes of this one, started bare on free loopback ports."""

    def __init__(
        self,
        workdir: Path,
        *,
        args: dict[str, list[str]] | None = None,
        http_services: dict[str, str] | None = None,
        startup_timeout: float = 120.0,
    ):
        """`http_services`: the module serving each service that is an HTTP server, not a gRPC one
        (it writes its port file once it serves, so its start is not waited on over gRPC)."""
        self.workdir = Path(workdir)
        self.args = args or {}
        self.http_services = http_services or {}
        self.startup_timeout = startup_timeout
        self.processes: dict[str, list[ServiceProcess]] = {}
        self.addresses: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def _process(self, name: str, extra: tuple[str, ...] = ()) -> ServiceProcess:
        return ServiceProcess(
            name,
            [*self.args.get(name, []), *extra],
            self.workdir,
            env=trace_file_environment(),
            startup_timeout=self.startup_timeout,
            module=self.http_services.get(name) or SERVICE_MODULES.get(name),
            wait_serving=name not in self.http_services,
        )

    def start(self, counts: dict[str, int]) -> dict[str, list[str]]:
        planned = [(name, self._process(name)) for name, count in counts.items() for _ in range(count)]
        with ThreadPoolExecutor(max(len(planned), 1)) as pool:
            futures = [pool.submit(process.start) for _, process in planned]
            errors = []
            for future in futures:
                try:
                    future.result()
                except Exception as exc:  # every start is awaited, so none is left running unseen
                    errors.append(exc)
        for name, process in planned:
            self.processes.setdefault(name, []).append(process)
        if errors:
            self.stop()
            raise errors[0]
        self.addresses = {name: [p.address for p in procs] for name, procs in self.processes.items()}
        return self.addresses

    def dead(self) -> DeadService | None:
        with self._lock:
            for name, procs in self.processes.items():
                for index, p in enumerate(procs):
                    if p.proc is not None and p.proc.poll() is not None:
                        tail = "\n".join(p.log_text().splitlines()[-TAIL_LINES:])
                        return DeadService(
                            name,
                            index,
                            f"(pid {p.pid}) {describe_exit(p.proc.returncode)}; last log lines:\n{tail}",
                        )
        return None

    def restart(self, name: str, index: int) -> str:
        return self._restart(name, index, same_port=False)

    def kill(self, name: str, index: int) -> None:
        with self._lock:
            process = self.processes[name][index]
        process.kill()

    def restart_in_place(self, name: str, index: int) -> str:
        """A new process on the dead one's port: whoever holds its address (channels included)
        reaches the new one without being told. Raises (ServiceExitedError, naming the port) if
        another process took the port meanwhile; the dead one stays in place then."""
        return self._restart(name, index, same_port=True)

    def _restart(self, name: str, index: int, *, same_port: bool) -> str:
        with self._lock:
            old = self.processes[name][index]
        old.stop(timeout=5.0)
        # A later --port overrides the "--port 0" every ServiceProcess is started with.
        new = self._process(name, ("--port", str(old.port)) if same_port else ()).start()
        with self._lock:
            self.processes[name][index] = new
            self.addresses[name][index] = new.address
        return new.address

    def stop(self) -> None:
        with self._lock:
            procs = [p for group in self.processes.values() for p in group]
        with ThreadPoolExecutor(max(len(procs), 1)) as pool:  # each drains on its own
            list(pool.map(lambda p: p.stop(), procs))
