"""The coordinator gRPC service: StartRun, ValidateRun, GetConfigSchema, GetRun, StreamMetrics,
StopRun, ListRuns."""

from __future__ import annotations

import json
import os

from rollway.common.config import to_dict
from rollway.common.log import get_logger
from rollway.common.server import RollwayServer, ServerConfig
from rollway.common.structs import from_struct
from rollway.coordinator.config import CoordinatorServiceConfig
from rollway.coordinator.config_schema import run_config_schema
from rollway.coordinator.dashboard import run_files
from rollway.coordinator.dashboard.server import start_for_coordinator
from rollway.coordinator.plan.text import plan
from rollway.coordinator.run_config import COMPONENTS
from rollway.coordinator.run_record import RunRecord
from rollway.coordinator.runs import RunManager
from rollway.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc

log = get_logger("rollway.coordinator.service")

STATES = {
    "STARTING": coordinator_pb2.RUN_STATE_STARTING,
    "RUNNING": coordinator_pb2.RUN_STATE_RUNNING,
    "SUCCEEDED": coordinator_pb2.RUN_STATE_SUCCEEDED,
    "FAILED": coordinator_pb2.RUN_STATE_FAILED,
    "STOPPED": coordinator_pb2.RUN_STATE_STOPPED,
}


def run_info(record: RunRecord, dashboard_url: str = "") -> coordinator_pb2.RunInfo:
    """The run as RunInfo. A record that cannot be reported (a bug) still gives its id, state and
    why, so that one run never breaks ListRuns for every client."""
    try:
        return _run_info(record, dashboard_url)
    except Exception as exc:
        log.exception("run cannot be reported", run_id=record.run_id)
        return coordinator_pb2.RunInfo(
            run_id=record.run_id,
            state=STATES.get(record.state, coordinator_pb2.RUN_STATE_UNSPECIFIED),
            run_dir=str(record.run_dir),
            error=f"{record.error} (this run's record cannot be reported: {type(exc).__name__}: {exc})",
        )


def _run_info(record: RunRecord, dashboard_url: str) -> coordinator_pb2.RunInfo:
    info = coordinator_pb2.RunInfo(
        run_id=record.run_id,
        state=STATES[record.state],
        run_dir=str(record.run_dir),
        error=record.error,
        num_restarts=record.num_restarts,
        notices=record.notices,
        startup=record.startup,
        dashboard_url=f"{dashboard_url}/?run={record.run_id}" if dashboard_url else "",
        created_time=record.created,
        started_time=record.started,
        finished_time=record.ended,
    )
    past = record.past
    if past is not None:  # a run read back from its directory (run_history.py)
        info.step, info.num_steps = past.step, past.num_steps
        info.last_metrics.update(past.last_metrics)
        info.checkpoint_dir, info.hf_export_dir = past.checkpoint_dir, past.hf_export_dir
        info.end_of_data = str((past.config.get("plan") or {}).get("end_of_data", ""))
        info.notices.extend(n["notice"] for n in run_files.read_notices(record.run_dir))
        info.config.update(jsonable_config(past.config.get("given") or {}))
    else:
        driver = record.driver
        info.step = driver.state.next_rollout_id if driver is not None else 0
        info.num_steps = record.config.num_rollout
        info.end_of_data = record.run.end_of_data
        if driver is not None:
            info.last_metrics.update(driver.last_step_metrics)
            info.checkpoint_dir, info.hf_export_dir = driver.checkpoint_dir, driver.hf_export_dir
        info.service_addresses.update(
            {
                (name if name != "rollout" else f"rollout_{i}"): address
                for name, group in record.addresses.items()
                for i, address in enumerate(group)
            }
        )
        info.config.update(jsonable_config(record.given))
    records, _ = run_files.read_metrics(record.run_dir)
    since = record.created if past is None else 0.0  # a live run: this attempt's pace (step_pace.py)
    interval = record.config.eval_interval if past is None else run_files.eval_interval(record.run_dir)
    progress = run_files.progress(records, info.num_steps, record.state, since, interval)
    info.seconds_per_step = progress["seconds_per_step"] or 0.0
    info.eta_seconds = progress["eta_seconds"] or 0.0
    return info


def jsonable_config(value):
    """A resolved config as JSON data for a Struct (tuples to lists, other objects as text)."""
    return json.loads(json.dumps(value, default=str))


class CoordinatorService(coordinator_pb2_grpc.CoordinatorServiceServicer):
    """Runs started over gRPC execute inside this process, one thread each."""

    def __init__(self, runs: RunManager):
        self.runs = runs
        self.dashboard_url = ""  # set once the dashboard serves

    def _info(self, record: RunRecord) -> coordinator_pb2.RunInfo:
        return run_info(record, self.dashboard_url)

    def StartRun(self, request, context):
        record = self.runs.start(from_struct(request.config), request.run_id)
        return coordinator_pb2.StartRunResponse(run=self._info(record))

    def ValidateRun(self, request, context):
        run = self.runs.validate(from_struct(request.config), request.run_id)
        return validation_reply(run)

    def GetConfigSchema(self, request, context):
        return coordinator_pb2.GetConfigSchemaResponse(json_schema=json.dumps(run_config_schema()))

    def GetRun(self, request, context):
        return coordinator_pb2.GetRunResponse(run=self._info(self.runs.get(request.run_id)))

    def StreamMetrics(self, request, context):
        """Each record as soon as it is written, with the run's state then. The records of the
        last step (and the final evaluation after it) wait for the run's end, so that the last
        one carries the final state. A run that ends before its last step (stopped, failed) just
        ends the stream: no extra record, as clients count steps by records (GetRun says how)."""
        record = self.runs.get(request.run_id)
        num_steps = run_info(record).num_steps
        held = None
        for metrics_record in self.runs.follow(request.run_id, request.from_step):
            if not context.is_active():
                return
            if held is not None:
                yield held
            metrics = {k: float(v) for k, v in metrics_record.items() if k not in ("step", "time")}
            reply = coordinator_pb2.StreamMetricsResponse(
                step=metrics_record["step"],
                metrics=metrics,
                time=metrics_record["time"],
                state=STATES[record.state],
            )
            held = reply if num_steps and reply.step >= num_steps - 1 else None
            if held is None:
                yield reply
        if held is not None:
            held.state = STATES[record.state]
            yield held

    def StopRun(self, request, context):
        record = self.runs.stop(request.run_id, immediate=request.immediate)
        return coordinator_pb2.StopRunResponse(run=self._info(record))

    def ListRuns(self, request, context):
        return coordinator_pb2.ListRunsResponse(runs=[self._info(r) for r in self.runs.list()])


def validation_reply(run) -> coordinator_pb2.ValidateRunResponse:
    """ValidateRun's answer: the steps and batch arithmetic of a valid run."""
    c = run.coordinator
    configs = {name: run.component(name) for name in COMPONENTS}
    reply = coordinator_pb2.ValidateRunResponse(
        num_steps=c.num_rollout,
        end_of_data=run.end_of_data,
        num_rows=run.num_rows or 0,
        samples_per_rollout=c.samples_per_rollout,
        optimizer_steps_per_rollout=c.samples_per_rollout // c.global_batch_size,
        plan=plan(configs, run.end_of_data),
    )
    if run.num_rows:
        reply.num_epochs = c.num_rollout * c.rollout_batch_size / run.num_rows
    reply.config.update(jsonable_config({name: to_dict(config) for name, config in configs.items()}))
    return reply


def serve(server_config: ServerConfig, config: CoordinatorServiceConfig) -> None:
    """Serve until SIGTERM; runs still going are asked to stop."""
    runs = RunManager(config.runs_root)
    server = RollwayServer("coordinator", server_config)
    service = CoordinatorService(runs)
    server.add_service(
        coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
        service,
        coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"],
    )
    server.on_stop(runs.stop_all)
    port = server.start()
    token = server_config.auth_token or os.environ.get("ROLLWAY_AUTH_TOKEN", "")
    dashboard = start_for_coordinator(runs, config, port, token, server_config.host)
    if dashboard is not None:
        service.dashboard_url = dashboard.url
    server.set_serving()
    server.wait_for_termination()
    if dashboard is not None:
        dashboard.stop()
