"""The dashboard's HTTP server (uvicorn) in a daemon thread of the process that owns the runs.

The server only reads run files and looks at run records; the run threads never wait on it. If
it fails to start or dies, the coordinator logs it and goes on: a dashboard never stops a run.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from rollway.common.log import get_logger

log = get_logger("rollway.coordinator.dashboard")
START_SECONDS = 30.0


class DashboardServer:
    """Serves create_app(...) on host:port (0: a free port) until stop()."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.host = host
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))  # bound here, so a taken port fails now, naming it
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="dashboard", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self._socket])
        except Exception as exc:  # the dashboard is gone; the runs go on
            log.error("dashboard stopped", error=str(exc))

    def start(self) -> DashboardServer:
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(START_SECONDS / 0.05)):
            if self._server.started or not self._thread.is_alive():
                break
            deadline.wait(0.05)
        if not self._server.started:
            raise RuntimeError(f"the dashboard did not start on {self.url}")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(5)
        self._socket.close()


# Where the dashboard goes by default, relative to the coordinator's gRPC port: clear of the service
# ports that usually sit right after it (the compose file's 50050-50053; +1 took the trainer's port).
DASHBOARD_PORT_OFFSET = 1000


def start_for_coordinator(
    runs_manager, config, grpc_port: int, token: str, grpc_host: str = "127.0.0.1"
) -> DashboardServer | None:
    """The coordinator's dashboard (None when disabled or when it cannot start: logged, not fatal)."""
    if config.dashboard_port == 0:
        return None
    port = config.dashboard_port
    grpc_address = f"{grpc_host}:{grpc_port}"
    if port == -1:
        beside = grpc_port + DASHBOARD_PORT_OFFSET
        port = beside if grpc_port and beside < 65536 else 0
    try:
        from rollway.common.tracing import trace_file_environment
        from rollway.coordinator.dashboard.app import create_app
        from rollway.coordinator.dashboard.runs_view import DashboardRuns

        runs = DashboardRuns(runs_manager, runs_root=Path(config.runs_root), coordinator_address=grpc_address)
        trace_file = trace_file_environment().get("ROLLWAY_TRACE_FILE", "")
        app = create_app(runs, token=token, trace_file=trace_file)
        try:
            server = DashboardServer(app, config.dashboard_host, port)
        except OSError:
            if config.dashboard_port != -1:
                raise
            server = DashboardServer(app, config.dashboard_host, 0)  # the port beside gRPC is taken
        server.start()
    except Exception as exc:
        log.error("dashboard not started", error=str(exc), port=port)
        return None
    log.info("dashboard serving", url=server.url)
    if config.dashboard_address_file:
        tmp = Path(config.dashboard_address_file + ".tmp")
        tmp.write_text(server.url)
        tmp.replace(config.dashboard_address_file)
    return server
