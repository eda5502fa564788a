"""One run as the coordinator holds it (RunRecord): its config, services, driver, state and the
lines it reports; what a finished run left on disk reads back into one (RunRecord.from_disk)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollway.common.log import get_logger
from rollway.common.supervision.supervisor import (
    DeadService,
    ServiceGroup,
)
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.dashboard import run_files
from rollway.coordinator.remote import Services
from rollway.coordinator.run import Run
from rollway.coordinator.run_config import RunConfig
from rollway.coordinator.run_history import PastRun

log = get_logger("rollway.coordinator.runs")


@dataclass
class RunRecord:
    """A run known to this coordinator: one it drives (`run`), or one read from disk (`past`)."""

    run_id: str
    run: RunConfig | None
    run_dir: Path
    state: str = "STARTING"  # STARTING, RUNNING, SUCCEEDED, FAILED, STOPPED
    error: str = ""
    stop: threading.Event = field(default_factory=threading.Event)
    driver: Run | None = None
    thread: threading.Thread | None = None
    created: float = field(default_factory=time.time)
    services: Services | None = None
    group: ServiceGroup | None = None
    addresses: dict[str, list[str]] = field(default_factory=dict)
    dead: DeadService | None = None  # the service whose death ended the run
    immediate: bool = False
    num_restarts: int = 0
    restart_streak: int = 0  # restarts since the run last completed a step (the backoff doubles)
    driver_at_restart: Run | None = None  # the driver when the last restart was made
    recoveries: list[dict] = field(default_factory=list)  # one per restart: service, index, seconds
    started: float = 0.0  # when it first ran a step's services (RUNNING)
    ended: float = 0.0
    past: PastRun | None = None  # a run this coordinator does not drive, as its directory tells
    # The flat config as StartRun took it (RunInfo.config: a client can send it back).
    given: dict = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)  # what the run survived, a line each (RunInfo)
    startup: list[str] = field(default_factory=list)  # what it did while starting (RunInfo)
    failed_at: float = 0.0  # time.monotonic() when the failure being recovered from was caught
    fresh: set[str] = field(default_factory=set)  # services restarted since the last Init (rollout_i)
    partition_retries: int = 0  # attempts redone after a partition healed (no restart)

    def starting(self, line: str) -> None:
        """A line of what the starting run is doing (RunInfo.startup, the log)."""
        self.startup.append(line)
        log.info("run starting", activity=line)

    def notice(self, line: str) -> None:
        self.notices.append(line)
        log.warning("run notice", notice=line)
        try:
            run_files.append_notice(self.run_dir, line)  # the dashboard's Runs view
        except OSError as exc:  # a full run_dir disk: the notice stays in GetRun and the log
            log.error("could not record a run notice", error=str(exc))

    @property
    def config(self) -> CoordinatorConfig:
        return self.run.coordinator

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def finished(self) -> bool:
        return self.state in ("SUCCEEDED", "FAILED", "STOPPED")

    @classmethod
    def from_disk(cls, past: PastRun) -> RunRecord:
        return cls(
            run_id=past.run_id, run=None, run_dir=past.run_dir, state=past.state, error=past.error,
            created=past.created, started=past.started, ended=past.finished,
            num_restarts=past.num_restarts, past=past,
        )  # fmt: skip


def steps_done(record: RunRecord) -> int:
    if record.past is not None:
        return record.past.step
    return record.driver.state.next_rollout_id if record.driver is not None else 0


def describe_error(exc: BaseException) -> str:
    """One line for a failed run: a service's status and message, or the exception."""
    import grpc

    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"a service call failed: {exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
