"""Errors a servicer raises to answer a call with a specific gRPC status.

The server's error interceptor turns these into status codes with their message; any other
exception becomes INTERNAL with a generic message (the traceback goes to the log, never to the
client), and the service keeps serving.
"""

import grpc


class RollwayError(Exception):
    """Base class: an error with a gRPC status code and a message meant for the caller.

    `violations` are (field, problem) pairs: the interceptor sends them as google.rpc.Status
    details (BadRequest.FieldViolation, or PreconditionFailure.Violation for
    FAILED_PRECONDITION), so a client maps each problem to its field without parsing the message."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, violations: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.message = message
        self.violations = list(violations or [])


class InvalidArgument(RollwayError):
    """A request field is wrong. The message starts with the field's name."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str, violations: list[tuple[str, str]] | None = None):
        super().__init__(f"{field}: {problem}", violations)
        self.field = field


class FailedPrecondition(RollwayError):
    """The request is valid but the service is not in a state to serve it (e.g. before Init)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


def problems_error(problems: list[tuple[str, str, bool]]) -> RollwayError:
    """One error for every problem of a request, each (field, problem, precondition): INVALID_ARGUMENT
    when any value is wrong, else FAILED_PRECONDITION (the values are fine; the world is not: a
    file missing, a service down). The message lists them all, "field: problem; field: problem"."""
    message = "; ".join(f"{field}: {problem}" for field, problem, _ in problems)
    pairs = [(field, problem) for field, problem, _ in problems]
    if all(precondition for _, _, precondition in problems):
        return FailedPrecondition(message, pairs)
    error = InvalidArgument(problems[0][0], problems[0][1], pairs)
    error.message = message
    return error


class ResourceExhausted(RollwayError):
    """The request exceeds a configured limit (batch over the memory budget, message size).

    retry=False for a limit a retry cannot lift (a full disk): the status carries a negative
    grpc-retry-pushback-ms, which tells clients (client.py) not to retry, as gRPC's retry design says."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry: bool = True):
        super().__init__(message)
        self.trailers = () if retry else (("grpc-retry-pushback-ms", "-1"),)


class NotFound(RollwayError):
    """A named thing (run, checkpoint, file) does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(RollwayError):
    """A thing with that name already exists (e.g. a run id)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class Unimplemented(RollwayError):
    """The RPC is declared in the contract but not implemented by this service yet."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Unavailable(RollwayError):
    """The service is temporarily unable to serve (draining, engine restarting). Retryable."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(RollwayError):
    """An internal wait (collective, reward call) ran past its timeout."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
