"""The coordinator gRPC service: StartRun, GetRun, StreamMetrics, StopRun, ListRuns."""

from __future__ import annotations

import os

from google.protobuf import json_format

from rollway.common.server import RollwayServer, ServerConfig
from rollway.coordinator.config import CoordinatorServiceConfig
from rollway.coordinator.dashboard.server import start_for_coordinator
from rollway.coordinator.runs import RunManager, RunRecord
from rollway.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc

STATES = {
    "STARTING": coordinator_pb2.RUN_STATE_STARTING,
    "RUNNING": coordinator_pb2.RUN_STATE_RUNNING,
    "SUCCEEDED": coordinator_pb2.RUN_STATE_SUCCEEDED,
    "FAILED": coordinator_pb2.RUN_STATE_FAILED,
    "STOPPED": coordinator_pb2.RUN_STATE_STOPPED,
}


def run_info(record: RunRecord) -> coordinator_pb2.RunInfo:
    driver = record.driver
    addresses = {
        (name if name != "rollout" else f"rollout_{i}"): address
        for name, group in record.addresses.items()
        for i, address in enumerate(group)
    }
    return coordinator_pb2.RunInfo(
        run_id=record.run_id,
        state=STATES[record.state],
        step=driver.state.next_rollout_id if driver is not None else 0,
        num_steps=record.config.num_rollout,
        run_dir=str(record.run_dir),
        error=record.error,
        last_metrics=driver.last_step_metrics if driver is not None else {},
        checkpoint_dir=driver.checkpoint_dir if driver is not None else "",
        hf_export_dir=driver.hf_export_dir if driver is not None else "",
        service_addresses=addresses,
        num_restarts=record.num_restarts,
        notices=record.notices,
    )


class CoordinatorService(coordinator_pb2_grpc.CoordinatorServiceServicer):
    """Runs started over gRPC execute inside this process, one thread each."""

    def __init__(self, runs: RunManager):
        self.runs = runs

    def StartRun(self, request, context):
        record = self.runs.start(json_format.MessageToDict(request.config), request.run_id)
        return coordinator_pb2.StartRunResponse(run=run_info(record))

    def GetRun(self, request, context):
        return coordinator_pb2.GetRunResponse(run=run_info(self.runs.get(request.run_id)))

    def StreamMetrics(self, request, context):
        for record in self.runs.follow(request.run_id, request.from_step):
            if not context.is_active():
                return
            metrics = {k: float(v) for k, v in record.items() if k not in ("step", "time")}
            yield coordinator_pb2.StreamMetricsResponse(
                step=record["step"], metrics=metrics, time=record["time"]
            )

    def StopRun(self, request, context):
        record = self.runs.stop(request.run_id, immediate=request.immediate)
        return coordinator_pb2.StopRunResponse(run=run_info(record))

    def ListRuns(self, request, context):
        return coordinator_pb2.ListRunsResponse(runs=[run_info(r) for r in self.runs.list()])


def serve(server_config: ServerConfig, config: CoordinatorServiceConfig) -> None:
    """Serve until SIGTERM; runs still going are asked to stop."""
    runs = RunManager(config.runs_root)
    server = RollwayServer("coordinator", server_config)
    server.add_service(
        coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
        CoordinatorService(runs),
        coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"],
    )
    server.on_stop(runs.stop_all)
    port = server.start()
    token = server_config.auth_token or os.environ.get("ROLLWAY_AUTH_TOKEN", "")
    dashboard = start_for_coordinator(runs, config, port, token, server_config.host)
    server.set_serving()
    server.wait_for_termination()
    if dashboard is not None:
        dashboard.stop()
