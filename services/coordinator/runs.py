"""The coordinator's runs: each run executes in a thread; the gRPC API starts, watches and stops them.

StartRun(config) ─> parse_run_config (every error at once) ─> RunRecord ─> thread: execute()
execute: start the services the config gives no address for (run_start.py), connect, Init
         each with its settings, check they agree ─> Run.execute() (run.py)
         a watcher reports a dead service at once (process exit, failed health checks; a hung
         one, frozen or making no progress, is killed first: hang_watch.py) and
         cancels the calls in flight, so the run fails naming it instead of waiting (or, within
         max_restarts, recovers from its last checkpoint on a new instance of it)
         a dead environment the run started is restarted on its port while the run goes on: the
         samples that were using it end FAILED, the next ones use the new process
         finally: EndRun on every service, stop the services the run started
"""

from __future__ import annotations

import copy
import functools
import json
import re
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from rollway.common.config import RUN_ID, to_dict
from rollway.common.errors import AlreadyExists, InvalidArgument, NotFound, problems_error
from rollway.common.log import bind_run_context, get_logger
from rollway.common.supervision.supervisor import (
    CannotRestart,
    DeadService,
    HealthWatch,
    LocalServiceGroup,
    ReplacementDied,
    ServiceGroup,
)
from rollway.common.v1 import common_pb2
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.dashboard import run_files
from rollway.coordinator.evaluation import Evaluator
from rollway.coordinator.hang_watch import HangWatch
from rollway.coordinator.metrics import MetricsSink
from rollway.coordinator.plan.host import gpu_present
from rollway.coordinator.plan.memory import resolve_dtype
from rollway.coordinator.remote import Services
from rollway.coordinator.run import Run, RunStopped
from rollway.coordinator.run_config import COMPONENTS, RunConfig, RunConfigError, parse_run_config
from rollway.coordinator.run_history import PastRun, is_run_dir, read_run, read_runs
from rollway.coordinator.run_start import (
    apply_placement,
    attached_services_down,
    connect,
    end_run,
    init_services,
    start_missing_services,
)
from rollway.coordinator.run_state import CheckpointWriteError
from rollway.coordinator.startup_report import Stopwatch, loading_line

log = get_logger("rollway.coordinator.runs")

RUN_ID_PATTERN = re.compile(RUN_ID)  # declared with the run_id setting
WATCH_SECONDS = 0.5
# After a failed call, how long to wait for the watcher to name a service that is dying.
DEAD_GRACE_SECONDS = 3.0


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


def _steps_done(record: RunRecord) -> int:
    if record.past is not None:
        return record.past.step
    return record.driver.state.next_rollout_id if record.driver is not None else 0


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


def execute(record: RunRecord, *, progress: bool = False) -> None:
    """Start or attach the run's services and drive the run to its end (in the calling thread)."""
    bind_run_context(run_id=record.run_id)
    watcher = None
    try:
        missing = sorted(name for name, given in record.run.addresses().items() if not given)
        if missing:
            record.starting(f"starting {', '.join(missing)} ...")
        stopwatch = Stopwatch(record.starting)
        addresses, record.group = start_missing_services(
            record.run, record.run_dir / "services", record.run_id
        )
        if missing:
            stopwatch.done("services up")
        record.addresses = addresses
        while True:
            if record.stop.is_set():
                raise RunStopped()
            watcher = _Watcher(record)
            try:
                record.services = connect(record.addresses)  # a service may die here too
                final = _attempt(record, progress=progress)
                break
            except RunStopped:
                raise
            except CheckpointWriteError:
                raise  # the run's own verdict (a full disk), not a dying service: no grace to wait
            except Exception as exc:
                if record.stop.is_set() and record.immediate:
                    # The call failed because StopRun cancelled it: no service to wait for (#38: the
                    # death grace made an immediate stop take 3.5 s where an after-step one took 0.4).
                    raise RunStopped() from exc
                record.failed_at = time.monotonic()
                dead = record.dead or watcher.wait_for_dead()
                if dead is None and _healed_partition(record, watcher, exc):
                    continue
                dead = dead or record.dead  # a service lost after its partition healed
                if not _recover(record, dead, exc):
                    raise
            finally:
                watcher.close()
                _release(record)
        record.driver.last_step_metrics.update(_evaluations(final))  # the final eval, for GetRun
        record.state = "SUCCEEDED"  # after it: GetRun never shows SUCCEEDED without the final eval
        _write_result(record, final)
    except RunStopped:
        record.state = "STOPPED"
    except Exception as exc:  # the run fails; the coordinator keeps serving
        if record.stop.is_set() and record.immediate:
            record.state = "STOPPED"
        else:
            dead = record.dead
            record.error = f"{dead} (the run cannot go on without it)" if dead else describe_error(exc)
            record.state = "FAILED"  # after the error: GetRun must never show a failure without its cause
            log.error("run failed", error=record.error, traceback=traceback.format_exc())
    finally:
        # The ending is recorded before the services are stopped: a stop may take a while (a drain,
        # an actor on a lost node), and a client that saw the final state may stop this process.
        record.ended = time.time()
        try:
            # for the dashboard, and GetRun's finished_time after a restart (the same time)
            run_files.write_status(record.run_dir, record.state, record.error, ended=record.ended)
        finally:
            if record.group is not None:
                record.group.stop()
        log.info("run ended", state=record.state, num_restarts=record.num_restarts)


def _attempt(record: RunRecord, *, progress: bool) -> dict[str, float]:
    """Init the services (afresh after a recovery) and run; resumes from the last checkpoint."""
    c = record.config
    loaders = _model_loaders(record)
    if loaders:
        record.starting(loading_line(record.run.component("trainer").hf_checkpoint, loaders))
    stopwatch, seconds = Stopwatch(record.starting), {}
    init_services(
        record.services, record.run, record.run_id, rebuild=record.num_restarts > 0,
        fresh=frozenset(record.fresh), seconds=seconds,
    )  # fmt: skip
    record.fresh.clear()
    stopwatch.done("services initialised", seconds)
    evaluator = None
    if c.eval_prompt_data and not c.train_only:
        sampling = common_pb2.SamplingParams(
            temperature=c.eval_temperature,
            top_p=1.0,
            top_k=-1,
            max_new_tokens=c.rollout_max_response_len,
            seed=c.rollout_seed,
        )
        evaluator = Evaluator(
            record.services,
            c.eval_prompt_data[::2],
            n_samples=c.n_samples_per_eval_prompt,
            sampling=sampling,
            reward=c.rm_type,
            prompts_per_generate=c.eval_prompts_per_generate,
        )
    previous = record.driver
    record.driver = Run(
        c,
        record.services,
        record.run_dir,
        evaluator=evaluator,
        stop=record.stop,
        progress=progress,
        notice=record.notice,
    )
    if previous is not None:  # GetRun keeps what the run did before the recovery
        record.driver.checkpoint_dir = previous.checkpoint_dir
        record.driver.on_resume = functools.partial(_notice_resume, record)
        previous.sink.close()
    _report_restarts(record)
    record.state = "RUNNING"
    if not record.started:
        record.started = time.time()
        try:  # kept for GetRun after a coordinator restart (run_history.py reads it)
            run_files.write_started(record.run_dir, record.started)
        except OSError as exc:
            log.error("could not record the run's start", error=str(exc))
    return record.driver.execute()


def _model_loaders(record: RunRecord) -> dict[str, str]:
    """The services that load the model at Init, with the dtype each loads it in ("auto" resolved
    where this coordinator started them: on this machine)."""
    on_gpu = gpu_present()
    local = isinstance(record.group, LocalServiceGroup)
    loaders = {}
    if record.services.trainer is not None:
        loaders["trainer"] = record.run.component("trainer").dtype
    for i in range(len(record.services.rollouts)):
        loaders[f"rollout_{i}"] = record.run.component("rollout").dtype
    return {name: resolve_dtype(dtype, on_gpu) if local else dtype for name, dtype in loaders.items()}


def _notice_resume(record: RunRecord, next_step: int, directory: Path | None) -> None:
    """Where a recovered run goes on from, and how long it took since the failure was caught
    (steps counted from 1, as the progress line does)."""
    source = f"checkpoint {directory.name}" if directory is not None else "the start: no checkpoint yet"
    record.notice(
        f"resuming at step {next_step + 1}/{record.driver.total_steps()} from {source}, "
        f"{time.monotonic() - record.failed_at:.1f}s after the failure"
    )


def _recover(record: RunRecord, dead: DeadService | None, exc: BaseException) -> bool:
    """Restart a dead service the run started, within max_restarts (False: the run fails)."""
    c = record.config
    group = record.group
    if dead is None or group is None or dead.name not in group.addresses or record.stop.is_set():
        return False
    if record.num_restarts >= c.max_restarts:
        log.error("no restarts left", service=str(dead).splitlines()[0], max_restarts=c.max_restarts)
        return False
    backoff = _backoff(record)
    log.warning("restarting a dead service", service=str(dead).splitlines()[0], backoff_seconds=backoff,
                restart=record.num_restarts + 1, failed_call=describe_error(exc))  # fmt: skip
    if record.stop.wait(backoff):
        return False
    while True:
        started = time.monotonic()
        try:
            record.addresses[dead.name][dead.index] = group.restart(dead.name, dead.index)
        except ReplacementDied as died:  # lost with its node before Ray said so: one more restart
            _count_restart(record, dead, started)
            dead = died.dead
            if record.num_restarts >= c.max_restarts or record.stop.is_set():
                record.dead = DeadService(dead.name, dead.index, f"{dead.detail}; no restarts left")
                return False
            continue
        except Exception as reason:  # fail fast, naming the dead service and why it stays dead
            why = str(reason) if isinstance(reason, CannotRestart) else describe_error(reason)
            record.dead = DeadService(dead.name, dead.index, f"{dead.detail}; not restarted: {why}")
            log.error("service not restarted", service=str(dead).splitlines()[0], reason=why)
            return False
        break
    record.fresh.add(dead.name if dead.name != "rollout" else f"rollout_{dead.index}")
    for name in group.rebuilt_by_restart() - {dead.name}:  # survivors that cannot rebuild in place
        try:
            record.addresses[name][0] = group.restart(name, 0)
        except Exception as reason:
            record.dead = DeadService(name, 0, f"restarted with {dead.name} for the recovery, but: {reason}")
            return False
        record.fresh.add(name)
    apply_placement(record.run, group)  # a restarted trainer rank 0 may host the weight group elsewhere
    if dead.name == "environment":  # the rollout services' Init of the next attempt tells them
        record.run.use_environment(record.addresses["environment"][0])
    _count_restart(record, dead, started)
    record.dead = None
    return True


def _healed_partition(record: RunRecord, watcher: _Watcher, exc: BaseException) -> bool:
    """A call failed while a service was cut off, and every service answers again before Ray
    declared its node lost: the run goes on from its last checkpoint on the same services, with no
    restart (at most max_restarts times: a link that flaps for ever fails the run)."""
    cut_off = watcher.unreachable_seen
    if not cut_off or record.stop.is_set() or record.partition_retries >= record.config.max_restarts:
        return False
    if any(record.group.unreachable(name, index) for name, index in cut_off):
        return False
    for name, index in sorted(cut_off):
        lost = record.group.settle(name, index)
        if lost is not None:  # Ray's late verdict: recovered as any lost service
            record.dead = lost
            return False
    record.partition_retries += 1
    names = ", ".join(f"{name}_{index}" for name, index in sorted(cut_off))
    record.notice(
        f"{names} answers again after a partition ({describe_error(exc)}); the run goes on from its "
        "last checkpoint on the same services, no restart"
    )
    return True


def _restart_environment(record: RunRecord, dead: DeadService, health: HealthWatch | None) -> bool:
    """The run's environment service died: a new one on its port while the run goes on (the
    samples that were using it end FAILED; the rollout services' channels reconnect to the same
    address). False: not restarted here (no restarts left, the run is stopping, or its port was
    taken: the run then recovers as for any dead service, on a new port, or fails naming it)."""
    c = record.config
    group = record.group
    if (
        not isinstance(group, LocalServiceGroup)
        or record.stop.is_set()
        or record.num_restarts >= c.max_restarts
    ):
        return False
    backoff = _backoff(record)
    log.warning("restarting the run's environment; the run goes on", service=str(dead).splitlines()[0],
                backoff_seconds=backoff, restart=record.num_restarts + 1)  # fmt: skip
    if record.stop.wait(backoff):
        return False
    started = time.monotonic()
    try:
        group.restart_in_place(dead.name, dead.index)
    except Exception as exc:  # its port was taken: restarted on a new one by the run's recovery
        log.warning(
            "the environment could not be restarted on its port", error=f"{type(exc).__name__}: {exc}"
        )
        return False
    if health is not None:
        health.restarted(dead.name, dead.index)
    _count_restart(record, dead, started)
    return True


def _backoff(record: RunRecord) -> float:
    """The wait before the next restart. It doubles while restarts follow each other (a crash
    loop), and starts over once the run has completed a step since the last one: a long run's
    tenth unrelated crash is not made to wait 30 s."""
    driver = record.driver
    if driver is not None and driver is not record.driver_at_restart and driver.last_step_metrics:
        record.restart_streak = 0
    return min(record.config.restart_backoff_seconds * 2**record.restart_streak, 30.0)


def _count_restart(record: RunRecord, dead: DeadService, started: float) -> None:
    record.num_restarts += 1
    record.restart_streak += 1
    record.driver_at_restart = record.driver
    record.recoveries.append(
        {
            "service": dead.name,
            "index": dead.index,
            "restart_seconds": time.monotonic() - started,
            "cause": dead.detail.splitlines()[0],
        }
    )
    log.info("service restarted", **record.recoveries[-1], restart=record.num_restarts)
    _report_restarts(record)  # before the notice: every step logged after it reports the restart
    record.notice(
        f"recovered: {str(dead).splitlines()[0]}; restarted in {record.recoveries[-1]['restart_seconds']:.1f}s "
        f"(restart {record.num_restarts}/{record.config.max_restarts})"
    )


def _report_restarts(record: RunRecord) -> None:
    """Every step after a restart reports them (fault/* metrics)."""
    if record.recoveries and record.driver is not None:
        record.driver.fault_metrics = {
            "fault/num_restarts": float(record.num_restarts),
            "fault/last_restart_seconds": record.recoveries[-1]["restart_seconds"],
        }


def _release(record: RunRecord) -> None:
    """EndRun on every service of this attempt, and close its channels."""
    if record.services is not None:
        end_run(record.services, record.run_id)
        record.services.close()
        record.services = None


def _evaluations(final: dict[str, float]) -> dict[str, float]:
    """The final evaluation's metrics among a run's final ones (logged after its last step)."""
    return {k: v for k, v in final.items() if k.startswith(("eval/", "passrate/"))}


def _write_result(record: RunRecord, final: dict[str, float]) -> None:
    (record.run_dir / "result.json").write_text(
        json.dumps(
            {
                "run_id": record.run_id,
                "final_metrics": final,
                "hf_export_dir": record.driver.hf_export_dir,
                "checkpoint_dir": record.driver.checkpoint_dir,
                "num_restarts": record.num_restarts,
                "recoveries": record.recoveries,
            },
            indent=1,
        )
    )


class _Watcher:
    """Watches a run's services; a dead one cancels the run's calls so that it ends at once."""

    def __init__(self, record: RunRecord):
        self.record = record
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
        # Every service, started or attached: a hung one is found by its progress (hang_watch.py).
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
                if dead.name == "environment" and _restart_environment(record, dead, self.health):
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


def describe_error(exc: BaseException) -> str:
    """One line for a failed run: a service's status and message, or the exception."""
    import grpc

    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"a service call failed: {exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


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
        if known.state == "SUCCEEDED" and num_rollout <= _steps_done(known):
            raise AlreadyExists(
                f"run {run_id} succeeded after {_steps_done(known)} steps: there is nothing to resume "
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
