"""Client side of the shared runtime: channels with deadlines, retries, auth and propagation.

    channel = open_channel("127.0.0.1:50051", ClientConfig(timeout_seconds=30))
    stub = trainer_pb2_grpc.TrainerServiceStub(channel)

Every call gets a deadline (the config's unless the caller passes `timeout=`). Unary calls to
methods in IDEMPOTENT_METHODS are retried with backoff when the server is UNAVAILABLE (restarting,
draining); nothing else is retried, so a mutating call is never applied twice by the client.
The caller's log context (run_id, step, weight_version) and trace context travel as metadata.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from structlog.contextvars import get_contextvars

from rollway.common.config import setting
from rollway.common.log import PROPAGATED_FIELDS, get_logger
from rollway.common.server import channel_options
from rollway.common.tracing import client_interceptor

log = get_logger("rollway.client")

# Methods safe to repeat: reads, and writes keyed by an idempotency key (batch_id, group spec,
# weight version) that the server deduplicates.
IDEMPOTENT_METHODS = frozenset(
    {
        "/grpc.health.v1.Health/Check",
        "/rollway.dataloader.v1.DataloaderService/NextBatch",
        "/rollway.dataloader.v1.DataloaderService/GetState",
        "/rollway.dataloader.v1.DataloaderService/Describe",
        "/rollway.rollout.v1.RolloutService/InitWeightGroup",
        "/rollway.rollout.v1.RolloutService/Pause",
        "/rollway.rollout.v1.RolloutService/Resume",
        "/rollway.rollout.v1.RolloutService/WeightChecksum",
        "/rollway.rollout.v1.RolloutService/GetInfo",
        "/rollway.trainer.v1.TrainerService/Init",
        "/rollway.trainer.v1.TrainerService/InitWeightGroup",
        "/rollway.trainer.v1.TrainerService/WeightChecksum",
        "/rollway.coordinator.v1.CoordinatorService/GetRun",
        "/rollway.coordinator.v1.CoordinatorService/ListRuns",
    }
)


@dataclass
class ClientConfig:
    """How a client reaches a rollway service."""

    timeout_seconds: float = setting(60.0, "deadline of a call that sets none")
    max_retries: int = setting(4, "retries of an idempotent call that found the server UNAVAILABLE")
    retry_backoff_seconds: float = setting(0.25, "first retry delay; doubles each retry")
    auth_token: str = setting("", "token sent as `authorization: Bearer TOKEN` (also ROLLWAY_AUTH_TOKEN)")
    tls_ca: str = setting("", "PEM CA to verify the server: use TLS")
    tls_cert: str = setting("", "PEM client certificate for mTLS")
    tls_key: str = setting("", "PEM key of --tls-cert")
    tls_server_name: str = setting("", "override the name checked against the server certificate")
    max_message_mb: int = setting(64, "largest message sent or accepted, in MiB")
    keepalive_seconds: float = setting(30.0, "HTTP/2 keepalive ping interval")


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _PolicyInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the default deadline, auth and context metadata; retries idempotent unary calls."""

    def __init__(self, config: ClientConfig):
        self._config = config
        self._token = config.auth_token or os.environ.get("ROLLWAY_AUTH_TOKEN", "")

    def _details(self, details: grpc.ClientCallDetails) -> _CallDetails:
        metadata = list(details.metadata or ())
        if self._token:
            metadata.append(("authorization", f"Bearer {self._token}"))
        context = get_contextvars()
        for name in PROPAGATED_FIELDS:
            if context.get(name) is not None:
                metadata.append((f"x-rollway-{name.replace('_', '-')}", str(context[name])))
        timeout = details.timeout if details.timeout is not None else self._config.timeout_seconds
        return _CallDetails(
            details.method,
            timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        details = self._details(client_call_details)
        retries = self._config.max_retries if details.method in IDEMPOTENT_METHODS else 0
        deadline = time.monotonic() + details.timeout
        delay = self._config.retry_backoff_seconds
        for attempt in range(retries + 1):
            remaining = max(deadline - time.monotonic(), 0.001)
            outcome = continuation(details._replace(timeout=remaining), request)
            code = outcome.code()
            if (
                code != grpc.StatusCode.UNAVAILABLE
                or attempt == retries
                or time.monotonic() + delay >= deadline
            ):
                return outcome
            log.info("retrying", method=details.method, attempt=attempt + 1, delay_seconds=delay)
            time.sleep(delay)
            delay *= 2
        return outcome

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


# Deployments (compose, Ray) turn TLS on for every client of a process through the environment,
# as ROLLWAY_AUTH_TOKEN does for the token: the coordinator and `rollway run` build their clients
# without flags of their own for it.
TLS_ENV = {
    "tls_ca": "ROLLWAY_TLS_CA",
    "tls_cert": "ROLLWAY_TLS_CERT",
    "tls_key": "ROLLWAY_TLS_KEY",
    "tls_server_name": "ROLLWAY_TLS_SERVER_NAME",
}


def _with_tls_env(config: ClientConfig) -> ClientConfig:
    """`config` with ROLLWAY_TLS_* filled in where it names no TLS file of its own."""
    if config.tls_ca:
        return config
    values = {field: os.environ.get(env, "") for field, env in TLS_ENV.items()}
    return dataclasses.replace(config, **values) if values["tls_ca"] else config


def open_channel(address: str, config: ClientConfig | None = None) -> grpc.Channel:
    """A channel to `address` with rollway's call policy, tracing, limits and (m)TLS.

    Without a CA in `config`, ROLLWAY_TLS_CA (and ROLLWAY_TLS_CERT/KEY for mTLS,
    ROLLWAY_TLS_SERVER_NAME) from the environment turn TLS on."""
    config = _with_tls_env(config or ClientConfig())
    options = channel_options(config.max_message_mb, config.keepalive_seconds)
    if config.tls_server_name:
        options.append(("grpc.ssl_target_name_override", config.tls_server_name))
    if config.tls_ca:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(config.tls_ca).read_bytes(),
            private_key=Path(config.tls_key).read_bytes() if config.tls_key else None,
            certificate_chain=Path(config.tls_cert).read_bytes() if config.tls_cert else None,
        )
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    # Tracing is outermost: one CLIENT span covers all retries of a call.
    return grpc.intercept_channel(channel, client_interceptor(), _PolicyInterceptor(config))


def wait_until_serving(
    address: str, timeout_seconds: float = 60.0, config: ClientConfig | None = None, service: str = ""
) -> None:
    """Poll grpc.health.v1 until `service` (default: the whole server) is SERVING, or raise TimeoutError."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_seconds
    last = "no answer"
    with open_channel(address, config) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            time.sleep(0.2)
    raise TimeoutError(f"{address} not SERVING after {timeout_seconds:.0f}s (last: {last})")
