"""A minimal service built on rollway's shared runtime, for testing the runtime itself.

    python -m support.probe_service --port 0 --port-file F [--ready-after S] [--relay-to ADDR]

Methods (raw bytes in and out, registered as rollway.test.v1.ProbeService):
  Sleep   sleeps float(request) seconds, answers b"slept"      (drain tests; a quiet call for the
          hang watch: Sleep is a watched call that makes no progress)
  Work    works float(request) seconds, beating progress every 0.1 s, answers b"worked"  (hang watch)
  Relay   calls grpc.health.v1 Check on --relay-to             (trace propagation)
  Log     logs an event "probe log" and answers b"logged"      (log context)
  Fail    request b"invalid": InvalidArgument; otherwise RuntimeError  (error mapping)
  Busy    request b"KEY N [pushback=MS]": the first N calls with KEY are refused RESOURCE_EXHAUSTED
          (with that grpc-retry-pushback-ms trailer if given); later ones answer b"attempt K"
  BusyStream  (server-streaming) request b"KEY N [broken]": refused as Busy, then streams
          b"attempt K", b"1", b"2"; with "broken" every call fails RESOURCE_EXHAUSTED after its
          first message                                             (client retries)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollway.common import progress
from rollway.common.client import open_channel
from rollway.common.config import parse_components, setting
from rollway.common.errors import InvalidArgument
from rollway.common.log import get_logger
from rollway.common.server import RollwayServer, ServerConfig

SERVICE = "rollway.test.v1.ProbeService"


@dataclass
class ProbeConfig:
    """Probe settings."""

    ready_after: float = setting(0.0, "seconds before health turns SERVING")
    relay_to: str = setting("", "address whose health Check Relay calls")


def _handlers(config: ProbeConfig):
    log = get_logger("probe")
    attempts: dict[str, int] = {}
    attempts_lock = threading.Lock()

    def refuse_first(request: bytes, context) -> tuple[int, list[str]]:
        """Count this call under its key; abort RESOURCE_EXHAUSTED while within the first N."""
        key, refusals, *options = request.decode().split()
        with attempts_lock:
            attempts[key] = attempt = attempts.get(key, 0) + 1
        if attempt <= int(refusals):
            for option in options:
                if option.startswith("pushback="):
                    context.set_trailing_metadata((("grpc-retry-pushback-ms", option.split("=", 1)[1]),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"busy: refusing call {attempt} of {key}")
        return attempt, options

    def busy(request: bytes, context) -> bytes:
        attempt, _ = refuse_first(request, context)
        return f"attempt {attempt}".encode()

    def busy_stream(request: bytes, context):
        attempt, options = refuse_first(request, context)
        yield f"attempt {attempt}".encode()
        if "broken" in options:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy after the first message")
        yield b"1"
        yield b"2"

    def sleep(request: bytes, context) -> bytes:
        log.info("probe sleeping")  # a test waits for this line: the call is being handled
        # Sleeps until the call ends for the server (its grace ran out, the client left): an
        # uninterruptible sleep would hold the process's exit, which waits for handler threads.
        ended = threading.Event()
        context.add_callback(ended.set)
        ended.wait(float(request or b"0"))
        return b"slept"

    def work(request: bytes, context) -> bytes:
        deadline = time.monotonic() + float(request or b"0")
        while time.monotonic() < deadline:
            time.sleep(0.1)
            progress.beat()
        return b"worked"

    def relay(request: bytes, context) -> bytes:
        with open_channel(config.relay_to) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status).encode()

    def log_event(request: bytes, context) -> bytes:
        log.info("probe log", payload=request.decode())
        return b"logged"

    def fail(request: bytes, context) -> bytes:
        if request == b"invalid":
            raise InvalidArgument("payload", "must not be 'invalid'")
        raise RuntimeError("boom: secret internal detail")

    def unary(fn):
        return grpc.unary_unary_rpc_method_handler(fn)

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Sleep": unary(sleep),
            "Work": unary(work),
            "Relay": unary(relay),
            "Log": unary(log_event),
            "Fail": unary(fail),
            "Busy": unary(busy),
            "BusyStream": grpc.unary_stream_rpc_method_handler(busy_stream),
        },
    )


def main(argv=None) -> None:
    server_config, config = parse_components([ServerConfig, ProbeConfig], argv, prog="probe")
    server = RollwayServer("probe", server_config, watched_calls=("Sleep", "Work"))
    server.add_service(
        lambda handler, srv: srv.add_generic_rpc_handlers((handler,)),
        _handlers(config),
        SimpleNamespace(full_name=SERVICE),
    )
    server.start()
    threading.Timer(config.ready_after, server.set_serving).start()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
