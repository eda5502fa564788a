"""Server interceptors: token auth, log context, exception-to-status mapping.

Order on the server (outermost first): tracing (tracing.server_interceptor), auth, context.
The context interceptor binds service/rpc/run_id/step/weight_version for structlog and turns
exceptions into statuses: RollwayError subclasses keep their code and message; anything else
becomes INTERNAL with a short message, while the traceback goes to the service's log.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from structlog.contextvars import bound_contextvars

from rollway.common.errors import RollwayError
from rollway.common.log import PROPAGATED_FIELDS, get_logger

AUTH_METADATA_KEY = "authorization"
# Health checks stay open so orchestrators (compose, Kubernetes) can probe without the token.
UNAUTHENTICATED_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})

log = get_logger("rollway.server")


def status_with_violations(exc: RollwayError) -> grpc.Status:
    """The error as a google.rpc.Status (grpc-status-details-bin trailer) whose details list each
    (field, problem): BadRequest.FieldViolation, or PreconditionFailure.Violation (type "STATE")
    for FAILED_PRECONDITION. The human message stays the status message."""
    from google.protobuf import any_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2
    from grpc_status import rpc_status

    if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
        detail = error_details_pb2.PreconditionFailure(
            violations=[
                error_details_pb2.PreconditionFailure.Violation(
                    type="STATE", subject=field, description=problem
                )
                for field, problem in exc.violations
            ]
        )
    else:
        detail = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=field, description=problem)
                for field, problem in exc.violations
            ]
        )
    packed = any_pb2.Any()
    packed.Pack(detail)
    status = status_pb2.Status(code=getattr(code_pb2, exc.code.name), message=exc.message, details=[packed])
    return rpc_status.to_status(status)


def wrap_handler(handler: grpc.RpcMethodHandler, wrap: Callable[[Callable, bool, bool], Callable]):
    """Rebuild a method handler with its behaviour wrapped, keeping its streaming shape."""
    if handler is None:
        return None
    req_stream, resp_stream = handler.request_streaming, handler.response_streaming
    if req_stream and resp_stream:
        factory, behaviour = grpc.stream_stream_rpc_method_handler, handler.stream_stream
    elif req_stream:
        factory, behaviour = grpc.stream_unary_rpc_method_handler, handler.stream_unary
    elif resp_stream:
        factory, behaviour = grpc.unary_stream_rpc_method_handler, handler.unary_stream
    else:
        factory, behaviour = grpc.unary_unary_rpc_method_handler, handler.unary_unary
    return factory(
        wrap(behaviour, req_stream, resp_stream),
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class AuthInterceptor(grpc.ServerInterceptor):
    """Rejects calls without `authorization: Bearer <token>` (constant-time comparison)."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method in UNAUTHENTICATED_METHODS:
            return continuation(handler_call_details)
        given = dict(handler_call_details.invocation_metadata or ()).get(AUTH_METADATA_KEY, "")
        given_bytes = given.encode() if isinstance(given, str) else given
        if hmac.compare_digest(given_bytes, self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)

        def deny(behaviour, req_stream, resp_stream):
            def refuse(request_or_iterator, context):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid auth token")

            return refuse

        return wrap_handler(handler, deny)


def _abort_for(exc: BaseException, context: grpc.ServicerContext, method: str) -> None:
    if isinstance(exc, RollwayError):
        log.info("rpc refused", code=exc.code.name, error=exc.message)
        if getattr(exc, "trailers", ()):
            context.set_trailing_metadata(exc.trailers)
        if exc.violations:
            context.abort_with_status(status_with_violations(exc))
        context.abort(exc.code, exc.message)
    log.exception("rpc failed", exc_type=type(exc).__name__)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}: {exc}"[:500])


class _RunningHandlers:
    """How many RPC handlers of this process are running (a handler may outlive its call: the
    server ends a call at the drain's deadline while its handler still unwinds)."""

    def __init__(self) -> None:
        self._count = 0
        self._cond = threading.Condition()

    def __enter__(self) -> None:
        with self._cond:
            self._count += 1

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no handler runs (True), at most `timeout` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count == 0, timeout)


RUNNING_HANDLERS = _RunningHandlers()


class ContextInterceptor(grpc.ServerInterceptor):
    """Binds log context from metadata and maps exceptions to gRPC statuses."""

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        metadata = dict(handler_call_details.invocation_metadata or ())
        fields: dict[str, Any] = {"rpc": method.rsplit("/", 1)[-1]}
        for name in PROPAGATED_FIELDS:
            value = metadata.get(f"x-rollway-{name.replace('_', '-')}")
            if value is not None:
                # step and weight_version are integers in every service's log lines, as in the coordinator's.
                fields[name] = int(value) if value.lstrip("-").isdigit() else value
        handler = continuation(handler_call_details)

        def guard(behaviour, req_stream, resp_stream):
            if resp_stream:

                def stream(request, context) -> Iterator[Any]:
                    with RUNNING_HANDLERS, bound_contextvars(**fields):
                        try:
                            yield from behaviour(request, context)
                        except Exception as exc:
                            if context.code() is not None:  # the servicer aborted itself
                                raise
                            _abort_for(exc, context, method)

                return stream

            def unary(request, context):
                with RUNNING_HANDLERS, bound_contextvars(**fields):
                    try:
                        return behaviour(request, context)
                    except Exception as exc:
                        if context.code() is not None:
                            raise
                        _abort_for(exc, context, method)

            return unary

        return wrap_handler(handler, guard)
