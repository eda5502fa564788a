"""Client side of the shared runtime: channels with deadlines, retries, auth and propagation.

    channel = open_channel("127.0.0.1:50051", ClientConfig(timeout_seconds=30))
    stub = trainer_pb2_grpc.TrainerServiceStub(channel)

Every call gets a deadline (the config's unless the caller passes `timeout=`). Retries, with
bounded exponential backoff (jittered, never past the call's deadline):
  - UNAVAILABLE (restarting, draining): unary calls to methods in IDEMPOTENT_METHODS only, since
    the call may have been applied before the connection broke.
  - RESOURCE_EXHAUSTED (the server is busy and refused the call): any unary call, since a refused
    call was not processed. Not when the message is over gRPC's size limit (retrying cannot help),
    nor when the server's `grpc-retry-pushback-ms` trailer is negative ("do not retry"); a
    non-negative pushback is the delay to use. Server-streaming calls: RetryingStream.
Nothing else is retried, so a mutating call is never applied twice by the client.
The caller's log context (run_id, step, weight_version) and trace context travel as metadata.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    busy_retries: int = setting(6, "retries of a call the server refused with RESOURCE_EXHAUSTED (busy)")
    retry_backoff_seconds: float = setting(0.25, "first retry delay; doubles each retry")
    max_retry_backoff_seconds: float = setting(2.0, "longest delay between two retries")
    auth_token: str = setting("", "token sent as `authorization: Bearer TOKEN` (also ROLLWAY_AUTH_TOKEN)")
    tls_ca: str = setting("", "PEM CA to verify the server: use TLS")
    tls_cert: str = setting("", "PEM client certificate for mTLS")
    tls_key: str = setting("", "PEM key of --tls-cert")
    tls_server_name: str = setting("", "override the name checked against the server certificate")
    max_message_mb: int = setting(64, "largest message sent or accepted, in MiB")
    keepalive_seconds: float = setting(30.0, "HTTP/2 keepalive ping interval")


RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"


def _refusal_retry_delay(call: Any, delay: float) -> float | None:
    """The delay before retrying a call the server refused with RESOURCE_EXHAUSTED; None: do not retry.

    gRPC's own size-limit errors say "larger than max": the same message would be refused again.
    A server's retry pushback (gRPC's retry design, A6) sets the delay, and a negative one forbids it."""
    if "larger than max" in (call.details() or ""):
        return None
    for key, value in call.trailing_metadata() or ():
        if key == RETRY_PUSHBACK_KEY:
            try:
                pushback_ms = int(value)
            except ValueError:
                return None
            return pushback_ms / 1000 if pushback_ms >= 0 else None
    return delay * random.uniform(0.5, 1.0)  # jitter: refused callers do not come back in step


class _Backoff:
    """Delays of one call's retries: doubling from `first`, at most `longest`."""

    def __init__(self, config: ClientConfig):
        self._next = config.retry_backoff_seconds
        self._longest = config.max_retry_backoff_seconds

    def next(self) -> float:
        delay = min(self._next, self._longest)
        self._next *= 2
        return delay


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

    def __init__(self, config: ClientConfig, stop: threading.Event | None = None):
        self._config = config
        self._token = config.auth_token or os.environ.get("ROLLWAY_AUTH_TOKEN", "")
        self._stop = stop or threading.Event()

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
        budget = {
            grpc.StatusCode.UNAVAILABLE: self._config.max_retries
            if details.method in IDEMPOTENT_METHODS
            else 0,
            grpc.StatusCode.RESOURCE_EXHAUSTED: self._config.busy_retries,
        }
        deadline = time.monotonic() + details.timeout
        backoff = _Backoff(self._config)
        attempt = 0
        while True:
            remaining = max(deadline - time.monotonic(), 0.001)
            outcome = continuation(details._replace(timeout=remaining), request)
            code = outcome.code()
            if budget.get(code, 0) <= 0:
                return outcome
            delay = backoff.next()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                delay = _refusal_retry_delay(outcome, delay)
            if delay is None or time.monotonic() + delay >= deadline:
                return outcome
            budget[code] -= 1
            attempt += 1
            log.info("retrying", method=details.method, code=code.name, attempt=attempt, delay_seconds=delay)
            if self._stop.wait(delay):  # the caller gave up on this channel's calls: no more retries
                return outcome

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


class RetryingStream:
    """A server-streaming call, started again while the server refuses it before its first response.

        stream = RetryingStream(lambda: stub.Generate(request, timeout=3600), client_config)
        for sample in stream:          # another thread may call stream.cancel()
            ...

    A RESOURCE_EXHAUSTED that ends the call before any response arrived means the server refused
    the whole call (busy), so it is started again after a backoff, up to `config.busy_retries`
    times (the same rules as unary calls: pushback, size limits). Once a response has arrived the
    call is never repeated: its error is raised, since the server has done part of the work.
    `start` must return a new call each time (the call's own `timeout` bounds each attempt).
    cancel() cancels the current attempt and stops any further one: iterating raises that
    attempt's error, as a plain call's iteration raises CANCELLED."""

    def __init__(self, start: Callable[[], Any], config: ClientConfig | None = None):
        self._start = start
        self._config = config or ClientConfig()
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._call: Any = None
        self.attempts = 0

    def cancel(self) -> None:
        """Cancel the current attempt and any retry (safe from any thread, any number of times)."""
        with self._lock:
            self._cancelled.set()
            call = self._call
        if call is not None:
            call.cancel()

    def __iter__(self) -> Iterator[Any]:
        backoff = _Backoff(self._config)
        retries = self._config.busy_retries
        while True:
            with self._lock:
                self._call = call = self._start()
                self.attempts += 1
                if self._cancelled.is_set():
                    call.cancel()
            received = False
            try:
                for response in call:
                    received = True
                    yield response
                return
            except grpc.RpcError as exc:
                if received or retries <= 0 or exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                delay = _refusal_retry_delay(exc, backoff.next())
                if delay is None:
                    raise
                retries -= 1
                log.info("retrying refused stream", attempt=self.attempts, delay_seconds=delay)
                if self._cancelled.wait(delay):
                    raise


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


def open_channel(
    address: str, config: ClientConfig | None = None, *, stop: threading.Event | None = None
) -> grpc.Channel:
    """A channel to `address` with rollway's call policy, tracing, limits and (m)TLS.

    Without a CA in `config`, ROLLWAY_TLS_CA (and ROLLWAY_TLS_CERT/KEY for mTLS,
    ROLLWAY_TLS_SERVER_NAME) from the environment turn TLS on. Once `stop` is set, a call waiting
    to be retried returns its last error at once (a supervisor that saw the service die)."""
    config = _with_tls_env(config or ClientConfig())
    options = channel_options(config.max_message_mb, config.keepalive_seconds)
    # gRPC's reconnect backoff grows to 120 s by default: a restarted service would wait that
    # long to be noticed again.
    options.append(("grpc.max_reconnect_backoff_ms", 5000))
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
    return grpc.intercept_channel(channel, client_interceptor(), _PolicyInterceptor(config, stop))


class UnreachableError(ConnectionError):
    """Nothing answers at an address (connection refused, or no route): the address is wrong or down."""


def wait_until_serving(
    address: str,
    timeout_seconds: float = 60.0,
    config: ClientConfig | None = None,
    service: str = "",
    *,
    unreachable_seconds: float = 10.0,
    check: Callable[[], None] | None = None,
) -> None:
    """Poll grpc.health.v1 until `service` (default: the whole server) is SERVING.

    Raises UnreachableError naming `address` once nothing has answered there for
    `unreachable_seconds` (refused or unroutable: a wrong address fails in seconds, not after
    `timeout_seconds`), and TimeoutError when it answers but is not SERVING in time. `check` runs
    between polls and may raise to stop waiting (ServiceProcess: the process exited)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    start = time.monotonic()
    deadline = start + timeout_seconds
    last_answer = start  # when something last answered at the address (any status, any error but these)
    silent = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    last = "no answer"
    config = dataclasses.replace(config or ClientConfig(), max_retries=0)  # this loop is the retry
    with open_channel(address, config) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if check is not None:
                check()
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last_answer = time.monotonic()
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
                if exc.code() not in silent:
                    last_answer = time.monotonic()
            now = time.monotonic()
            if now - last_answer >= unreachable_seconds:
                raise UnreachableError(
                    f"{address} is unreachable: nothing answered there for {now - last_answer:.0f}s ({last})"
                )
            if now >= deadline:
                raise TimeoutError(f"{address} not SERVING after {timeout_seconds:.0f}s (last: {last})")
            time.sleep(0.2)
