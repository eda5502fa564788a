"""Errors a servicer raises to answer a call with a specific gRPC status.

The server's error interceptor turns these into status codes with their message; any other
exception becomes INTERNAL with a generic message (the traceback goes to the log, never to the
client), and the service keeps serving.
"""

import grpc


class RollwayError(Exception):
    """Base class: an error with a gRPC status code and a message meant for the caller."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(RollwayError):
    """A request field is wrong. The message starts with the field's name."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


class FailedPrecondition(RollwayError):
    """The request is valid but the service is not in a state to serve it (e.g. before Init)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


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
