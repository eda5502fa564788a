"""A run's life in the coordinator, in the run's own thread (execute): start or attach its
services, Init them, drive Run.execute() (run.py) to the end; a dead service (watch.py's RunWatch
names it) fails the run, or, within max_restarts, the run recovers from its last checkpoint on a
new instance of it; finally EndRun on every service, stop the ones the run started, and write the
result."""

from __future__ import annotations

import functools
import json
import time
import traceback
from pathlib import Path

from rollway.common.log import bind_run_context, get_logger
from rollway.common.supervision.supervisor import (
    CannotRestart,
    DeadService,
    LocalServiceGroup,
    ReplacementDied,
)
from rollway.common.v1 import common_pb2
from rollway.coordinator.dashboard import run_files
from rollway.coordinator.evaluation import Evaluator
from rollway.coordinator.plan.host import gpu_present
from rollway.coordinator.plan.memory import resolve_dtype
from rollway.coordinator.run import Run, RunStopped
from rollway.coordinator.run_record import RunRecord, describe_error
from rollway.coordinator.run_start import (
    apply_placement,
    connect,
    end_run,
    init_services,
    start_missing_services,
)
from rollway.coordinator.run_state import CheckpointWriteError
from rollway.coordinator.startup_report import Stopwatch, loading_line
from rollway.coordinator.watch import HealthWatch, RunWatch

log = get_logger("rollway.coordinator.runs")


def execute(record: RunRecord, *, progress: bool = False) -> None:
    """Start or attach the run's services and drive the run to its end (in the calling thread)."""
    bind_run_context(run_id=record.run_id)
    watcher = None
    state, error = None, ""  # how the run ends: published after status.json is written (below)
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
            watcher = RunWatch(record, functools.partial(_restart_environment, record))
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
        _write_result(record, final)
        state = "SUCCEEDED"
    except RunStopped:
        state = "STOPPED"
    except Exception as exc:  # the run fails; the coordinator keeps serving
        if record.stop.is_set() and record.immediate:
            state = "STOPPED"
        else:
            dead = record.dead
            error = f"{dead} (the run cannot go on without it)" if dead else describe_error(exc)
            state = "FAILED"
            log.error("run failed", error=error, traceback=traceback.format_exc())
    finally:
        # The ending is recorded before the services are stopped: a stop may take a while (a drain,
        # an actor on a lost node), and a client that saw the final state may stop this process.
        record.ended = time.time()
        if state is None:  # not an Exception (the thread is going down): record the run as it was
            state, error = record.state, record.error
        try:
            # for the dashboard, and GetRun's finished_time after a restart (the same time)
            run_files.write_status(record.run_dir, state, error, ended=record.ended)
        finally:
            # Published only now: a client that saw the final state finds status.json (and
            # result.json) written; the error first, so GetRun never shows a failure without it.
            record.error = error
            record.state = state
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


def _healed_partition(record: RunRecord, watcher: RunWatch, exc: BaseException) -> bool:
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
