"""The coordinator's runs: each run executes in a thread; the gRPC API starts, watches and stops them.

StartRun(config) ─> parse_run_config (every error at once) ─> RunRecord (run_record.py) ─> thread:
execute() (run_loop.py): start the services the config gives no address for (run_start.py), connect, Init
         each with its settings, check they agree ─> Run.execute() (run.py)
         a watcher reports a dead service at once (process exit, failed health checks; a hung
         one, frozen or making no progress, is killed first: watch.py) and
         cancels the calls in flight, so the run fails naming it instead of waiting (or, within
         max_restarts, recovers from its last checkpoint on a new instance of it)
         a dead environment the run started is restarted on its port while the run goes on: the
         samples that were using it end FAILED, the next ones use the new process
         finally: EndRun on every service, stop the services the run started
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from pathlib import Path

from rollway.common.config import RUN_ID, to_dict
from rollway.common.errors import AlreadyExists, InvalidArgument, NotFound, problems_error
from rollway.common.log import get_logger
from rollway.coordinator.dashboard import run_files
from rollway.coordinator.metrics import MetricsSink
from rollway.coordinator.run_config import COMPONENTS, RunConfig, RunConfigError, parse_run_config
from rollway.coordinator.run_history import is_run_dir, read_run, read_runs
from rollway.coordinator.run_loop import execute
from rollway.coordinator.run_record import RunRecord, steps_done
from rollway.coordinator.run_start import (
    attached_services_down,
)

log = get_logger("rollway.coordinator.runs")

RUN_ID_PATTERN = re.compile(RUN_ID)  # declared with the run_id setting


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-", time.gmtime()) + f"{time.time_ns() % 1_000_000:06d}"


def check_run_id(run_id: str, setting: str = "run_id") -> str:
    """A run id that stays inside the runs root (InvalidArgument naming it otherwise)."""
    if not RUN_ID_PATTERN.fullmatch(run_id):
        raise InvalidArgument(
            setting,
            f"{run_id!r} is not a run id: 1-128 letters, digits, '.', '_' or '-', not starting with "
            "'.' or '-' (it names a directory under the runs root)",
        )
    return run_id


class RunManager:
    """Runs of this coordinator process, by id, and the runs found under its runs root at start
    (a restarted coordinator lists and gets them: their directories are the source of truth).

    Run ids: an id names one history. StartRun with the id of a run that exists (running, finished
    or on disk) is refused with ALREADY_EXISTS, unless the config says `resume: true` and that run
    did not succeed: then it continues from its newest checkpoint (the launcher does so when it
    restarts a crashed coordinator). A succeeded run's files are never touched again."""

    def __init__(self, default_run_root: str = "runs"):
        self.default_run_root = default_run_root
        self._runs: dict[str, RunRecord] = {
            past.run_id: RunRecord.from_disk(past) for past in read_runs(Path(default_run_root))
        }
        self._lock = threading.Lock()

    def admit(self, mapping: dict, run_id: str = "") -> RunConfig:
        """The run config, checked as StartRun checks it, without starting anything (a
        RollwayError listing every problem otherwise)."""
        if run_id:
            check_run_id(run_id)
        try:
            run = parse_run_config(mapping, check_files=True, strict=True)
        except RunConfigError as exc:
            raise problems_error(
                [
                    (f"config.{setting}", problem, setting in exc.preconditions)
                    for setting, problem in exc.problems
                ]
            ) from None
        down = attached_services_down(run)
        if down:
            raise problems_error([(f"config.{setting}", problem, True) for setting, problem in down])
        return run

    def validate(self, mapping: dict, run_id: str = "") -> RunConfig:
        """ValidateRun: StartRun's checks, the run id's included, and nothing registered."""
        run = self.admit(mapping, run_id)
        run_id = run_id or run.coordinator.run_id
        if run_id:
            check_run_id(run_id, "config.run_id")
            with self._lock:
                self._check_new_id(
                    run_id,
                    Path(run.coordinator.run_dir or self.default_run_root) / run_id,
                    run.coordinator.resume,
                    run.coordinator.num_rollout,
                )
        return run

    def start(self, mapping: dict, run_id: str = "") -> RunRecord:
        run = self.admit(mapping, run_id)
        run_id = check_run_id(run_id or run.coordinator.run_id or new_run_id(), "config.run_id")
        run_dir = Path(run.coordinator.run_dir or self.default_run_root) / run_id
        with self._lock:
            self._check_new_id(run_id, run_dir, run.coordinator.resume, run.coordinator.num_rollout)
            record = RunRecord(run_id=run_id, run=run, run_dir=run_dir, given=copy.deepcopy(run.given))
            self._runs[run_id] = record
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved = {name: to_dict(run.component(name)) for name in COMPONENTS}
        plan = {
            "num_steps": run.coordinator.num_rollout,
            "end_of_data": run.end_of_data,
            "created": record.created,
        }
        (run_dir / "config.json").write_text(
            json.dumps({"given": run.given, **resolved, "plan": plan}, indent=1, default=str)
        )
        # No state yet (a resumed run is going on again), and room kept for its ending on a full disk.
        run_files.reserve_status(run_dir)
        record.thread = threading.Thread(target=execute, args=(record,), name=f"run-{run_id}", daemon=True)
        record.thread.start()
        log.info("run started", run_id=run_id, run_dir=str(run_dir))
        return record

    def _check_new_id(self, run_id: str, run_dir: Path, resume: bool, num_rollout: int) -> None:
        known = self._runs.get(run_id)
        if known is not None and not known.finished:
            raise AlreadyExists(f"run {run_id} is already running")
        if known is None and is_run_dir(run_dir):
            known = RunRecord.from_disk(read_run(run_dir))
        if known is None:
            return
        if not resume:
            raise AlreadyExists(
                f"run {run_id} exists ({known.state}, in {known.run_dir}); its history is kept: choose "
                "another run_id, or give resume: true to continue a run that did not succeed"
            )
        # A run that succeeded may be extended (more steps: its history is kept, new steps follow
        # it, as the demo's SFT chunks do), never redone.
        if known.state == "SUCCEEDED" and num_rollout <= steps_done(known):
            raise AlreadyExists(
                f"run {run_id} succeeded after {steps_done(known)} steps: there is nothing to resume "
                f"with num_rollout {num_rollout}; extend it with more steps, or choose another run_id"
            )

    def get(self, run_id: str) -> RunRecord:
        with self._lock:
            if run_id not in self._runs:
                raise NotFound(f"run_id: no run {run_id!r}")
            return self._runs[run_id]

    def list(self) -> list[RunRecord]:
        with self._lock:
            return sorted(self._runs.values(), key=lambda r: r.created, reverse=True)

    def stop(self, run_id: str, immediate: bool = False) -> RunRecord:
        """Stop after the current step, or at once (the calls in flight are cancelled: generation
        is aborted and the trainer's step abandoned; checkpoints already written stay)."""
        record = self.get(run_id)
        record.immediate = record.immediate or immediate
        record.stop.set()
        if immediate and record.services is not None:
            record.services.cancel_all()
        return record

    def follow(self, run_id: str, from_step: int):
        """Metrics records of a run from `from_step`, following until the run ends."""
        record = self.get(run_id)
        while record.driver is None and not record.finished:
            time.sleep(0.05)  # the run is starting its services; it either runs or ends
        if record.driver is None:
            yield from (r for r in MetricsSink.read(record.metrics_path) if r["step"] >= from_step)
            return
        # A recovery replaces the driver (and its sink): follow the new one from the next step on.
        driver, next_step = record.driver, from_step
        while True:
            for metrics in driver.sink.follow(next_step):
                next_step = max(next_step, metrics["step"] + 1)
                yield metrics
            while record.driver is driver and not record.finished:
                time.sleep(0.05)  # the sink closed: the run ended, or a recovery is under way
            if record.driver is driver:
                break
            driver = record.driver
        if record.thread is not None:
            record.thread.join(60)  # the stream ends once the run's final state is visible to GetRun

    def stop_all(self) -> None:
        for record in self.list():
            self.stop(record.run_id, immediate=True)
        for record in self.list():
            if record.thread is not None:
                record.thread.join(30)
