"""One way to serve a rollway service: health, reflection, limits, interceptors, graceful drain.

    server = RollwayServer("dataloader", config)
    server.add_service(dataloader_pb2_grpc.add_DataloaderServiceServicer_to_server, servicer,
                       dataloader_pb2.DESCRIPTOR.services_by_name["DataloaderService"])
    server.start()
    ...load what the service needs...
    server.set_serving()              # health: NOT_SERVING -> SERVING
    server.wait_for_termination()     # SIGTERM/SIGINT: NOT_SERVING, stop(grace), on_stop hooks

Health is NOT_SERVING from start until the service says it is ready, and again while draining,
so load balancers stop sending work before in-flight calls are allowed `grace_seconds` to finish.

A service started by a rollway launcher (ROLLWAY_PARENT_PID, see parent_watch) drains and exits
when that launcher dies, within PARENT_GONE_GRACE_S: it never outlives the launcher as an orphan.
A port already held by another process is refused (no SO_REUSEPORT), so two services never
split one port's clients between them.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rollway.common.config import ConfigError, setting
from rollway.common.interceptors import AuthInterceptor, ContextInterceptor
from rollway.common.log import configure_logging, get_logger
from rollway.common.parent_watch import parent_gone, watch_parent
from rollway.common.progress import ProgressInterceptor, ProgressServicer
from rollway.common.reflection import enable_reflection
from rollway.common.tracing import configure_tracing, server_interceptor, shutdown_tracing
from rollway.common.v1 import progress_pb2, progress_pb2_grpc

MiB = 1024 * 1024
# When the launcher is gone nobody waits for a long drain: in-flight calls get this long, and the
# process exits PARENT_GONE_EXIT_S later whatever it is doing (a hung hook, a load in progress).
PARENT_GONE_GRACE_S = 3.0
PARENT_GONE_EXIT_S = 10.0


class PortInUseError(OSError):
    """The port a service was told to bind is held by another process."""


def _bind_error(host: str, port: int) -> OSError:
    """Why gRPC could not bind host:port (it does not say): bind a plain socket there to find out."""
    address = f"{host}:{port}"
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.bind(sockaddr)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return PortInUseError(
                exc.errno,
                f"could not bind {address}: port {port} is already in use by another process "
                "(a rollway service already there?); pick another --port, or 0 for a free one",
            )
        return OSError(exc.errno, f"could not bind {address}: {exc.strerror}")
    return OSError(f"could not bind {address}")


@dataclass
class ServerConfig:
    """Network, security and observability settings shared by every service."""

    host: str = setting("127.0.0.1", "address to bind; 127.0.0.1 unless told otherwise")
    port: int = setting(0, "port to bind; 0 picks a free port (see --port-file)")
    port_file: str = setting("", "write the bound port to this file once serving starts")
    max_message_mb: int = setting(64, "largest gRPC message accepted or sent, in MiB")
    max_workers: int = setting(16, "threads handling calls")
    grace_seconds: float = setting(30.0, "on SIGTERM, how long in-flight calls may take to finish")
    keepalive_seconds: float = setting(30.0, "HTTP/2 keepalive ping interval")
    auth_token: str = setting("", "require `authorization: Bearer TOKEN` (also ROLLWAY_AUTH_TOKEN)")
    tls_cert: str = setting("", "PEM server certificate: serve TLS")
    tls_key: str = setting("", "PEM private key of --tls-cert")
    tls_client_ca: str = setting("", "PEM CA: require client certificates signed by it (mTLS)")
    log_format: Literal["auto", "json", "pretty"] = setting("auto", "log format; auto is pretty on a TTY")
    log_level: str = setting("INFO", "log level")
    trace_file: str = setting("", "append finished spans as JSON lines here (also ROLLWAY_TRACE_FILE)")

    def validate(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError("port", f"must be in [0, 65535] (got {self.port})")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_key" if self.tls_cert else "tls_cert", "tls_cert and tls_key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca", "mTLS needs tls_cert and tls_key too")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(name, f"file not found: {path}")
        if self.max_message_mb <= 0:
            raise ConfigError("max_message_mb", "must be positive")


def channel_options(max_message_mb: int, keepalive_seconds: float) -> list[tuple[str, Any]]:
    """gRPC options used by both servers and clients: explicit size limits and keepalive."""
    return [
        ("grpc.max_send_message_length", max_message_mb * MiB),
        ("grpc.max_receive_message_length", max_message_mb * MiB),
        ("grpc.keepalive_time_ms", int(keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


class ListingHealthServicer(health.HealthServicer):
    """grpc.health.v1 with List as well (grpcio-health-checking advertises it in the service
    descriptor, so reflection lists it, but leaves it UNIMPLEMENTED): every service's status."""

    def List(self, request, context):  # noqa: N802 (the gRPC method name)
        with self._lock:
            statuses = {
                name: health_pb2.HealthCheckResponse(status=status)
                for name, status in self._server_status.items()
            }
        return health_pb2.HealthListResponse(statuses=statuses)


class RollwayServer:
    """A gRPC server with rollway's health, reflection, interceptors and drain behaviour."""

    def __init__(self, service: str, config: ServerConfig, watched_calls: Iterable[str] = ()):
        """`watched_calls`: the long calls (method names) GetProgress reports for hang detection."""
        self.service = service
        self.config = config
        configure_logging(service, config.log_format, config.log_level)
        configure_tracing(service, config.trace_file or None)
        self.log = get_logger(f"rollway.{service}")
        interceptors: list[grpc.ServerInterceptor] = [server_interceptor()]
        token = config.auth_token or os.environ.get("ROLLWAY_AUTH_TOKEN", "")
        # Also the root of the weight groups' secret (rollway.common.weight_sync.group_proof).
        self.auth_token = token
        if token:
            interceptors.append(AuthInterceptor(token))
        interceptors.append(ContextInterceptor())
        interceptors.append(ProgressInterceptor(watched_calls))
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix=f"{service}-rpc"),
            interceptors=interceptors,
            # Without SO_REUSEPORT a second server on a held port fails to bind instead of
            # silently sharing it (the kernel would split new connections between the two).
            options=[
                *channel_options(config.max_message_mb, config.keepalive_seconds),
                ("grpc.so_reuseport", 0),
            ],
        )
        self._health = ListingHealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self._service_names: list[str] = []
        self.add_service(
            progress_pb2_grpc.add_ProgressServiceServicer_to_server,
            ProgressServicer(),
            progress_pb2.DESCRIPTOR.services_by_name["ProgressService"],
        )
        self._on_stop: list[Callable[[], None]] = []
        self._on_drain: list[Callable[[float], None]] = []
        self._stopped = threading.Event()
        self._finished = threading.Event()
        self.port: int | None = None
        watch_parent(self._parent_gone)

    def _parent_gone(self, parent_pid: int) -> None:
        self.log.warning("launcher gone: stopping", parent_pid=parent_pid)
        exit_timer = threading.Timer(PARENT_GONE_GRACE_S + PARENT_GONE_EXIT_S, os._exit, args=(1,))
        exit_timer.daemon = True
        exit_timer.start()
        self.stop(min(self.config.grace_seconds, PARENT_GONE_GRACE_S))

    def add_service(
        self, add_to_server: Callable[[Any, grpc.Server], None], servicer: Any, descriptor: Any
    ) -> None:
        """Register a servicer; `descriptor` is the pb2 ServiceDescriptor (for health and reflection)."""
        add_to_server(servicer, self._server)
        self._service_names.append(descriptor.full_name)

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Run `hook` after the server has drained (release engines, process groups, files)."""
        self._on_stop.append(hook)

    def on_drain(self, hook: Callable[[float], None]) -> None:
        """Run `hook(grace_seconds)` as draining starts, before in-flight calls are waited for: it
        must return at once (end queued work, schedule what must happen before the grace ends)."""
        self._on_drain.append(hook)

    def start(self) -> int:
        """Bind and start serving (health NOT_SERVING). Returns the bound port."""
        enable_reflection(self._server, [*self._service_names, health.SERVICE_NAME])
        self._set_status(health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self.config.host}:{self.config.port}"
        if self.config.tls_cert:
            credentials = grpc.ssl_server_credentials(
                [(Path(self.config.tls_key).read_bytes(), Path(self.config.tls_cert).read_bytes())],
                root_certificates=Path(self.config.tls_client_ca).read_bytes()
                if self.config.tls_client_ca
                else None,
                require_client_auth=bool(self.config.tls_client_ca),
            )
        else:
            credentials = None
        try:
            if credentials is not None:
                self.port = self._server.add_secure_port(address, credentials)
            else:
                self.port = self._server.add_insecure_port(address)
        except RuntimeError:  # grpcio raises on a failed bind (older versions returned 0)
            self.port = 0
        if not self.port:
            raise _bind_error(self.config.host, self.config.port)
        self._server.start()
        if self.config.port_file:
            tmp = Path(self.config.port_file + ".tmp")
            tmp.write_text(str(self.port))
            tmp.replace(self.config.port_file)  # atomic: readers never see a partial number
        self.log.info(
            "listening",
            host=self.config.host,
            port=self.port,
            tls=bool(self.config.tls_cert),
            services=self._service_names,
        )
        return self.port

    def set_serving(self, serving: bool = True) -> None:
        """Flip health between SERVING and NOT_SERVING for the server and each service."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        self._set_status(status)
        self.log.info("health", serving=serving)

    def _set_status(self, status: int) -> None:
        for name in ["", *self._service_names]:
            self._health.set(name, status)

    def stop(self, grace: float | None = None) -> None:
        """Drain: NOT_SERVING, refuse new calls, let in-flight ones finish within `grace`, run hooks."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.config.grace_seconds if grace is None else grace
        self.log.info("draining", grace_seconds=grace)
        # NOT_SERVING for every service, and later set() calls are ignored while draining.
        self._health.enter_graceful_shutdown()
        stopped = self._server.stop(grace)
        for drain in self._on_drain:
            try:
                drain(grace)
            except Exception:
                self.log.exception("on_drain hook failed")
        stopped.wait()
        for hook in self._on_stop:
            try:
                hook()
            except Exception:
                self.log.exception("on_stop hook failed")
        self.log.info("stopped")
        shutdown_tracing()
        self._finished.set()

    def wait_for_termination(self) -> None:
        """Block until SIGTERM/SIGINT (then drain) or until stop() is called from elsewhere."""

        def handle(signum, _frame):
            self.log.info("signal", signal=signal.Signals(signum).name)
            # The launcher's death signal: drain as the parent watch does, briefly.
            grace = min(self.config.grace_seconds, PARENT_GONE_GRACE_S) if parent_gone() else None
            # Drain off the signal handler: stop() blocks for up to grace_seconds.
            threading.Thread(target=self.stop, args=(grace,), daemon=True).start()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
        while not self._finished.wait(0.5):
            pass
