"""`python -m rollway.common.healthcheck ADDR`: exit 0 when the service at ADDR is SERVING.

    python -m rollway.common.healthcheck 127.0.0.1:50051            # the whole server
    python -m rollway.common.healthcheck trainer:50051 --service rollway.trainer.v1.TrainerService

One grpc.health.v1 Check with a short deadline, for container health checks (docker compose
retries it). It prints the status and exits 0 (SERVING), 1 (NOT_SERVING, unknown service, or no
answer) or 2 (bad arguments). Token and TLS settings are those of any rollway client
(--auth-token or ROLLWAY_AUTH_TOKEN, --tls-ca, ...). No torch import: it is quick to start.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rollway.common.config import ConfigError, add_flags, from_dict


def check(address: str, service: str = "", timeout_seconds: float = 5.0, client_config=None) -> str:
    """The health status name of `service` at `address` (SERVING, NOT_SERVING, ...) or the call's error."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from rollway.common.client import ClientConfig, open_channel

    config = client_config or ClientConfig(max_retries=0)
    with open_channel(address, config) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_seconds)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: Sequence[str] | None = None) -> int:
    from rollway.common.client import ClientConfig

    parser = argparse.ArgumentParser(
        prog="python -m rollway.common.healthcheck", description=__doc__.splitlines()[0]
    )
    parser.add_argument("address", help="host:port of a rollway service")
    parser.add_argument("--service", default="", help="service name to check (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=5.0, help="deadline of the Check call, in seconds")
    add_flags(parser, ClientConfig)
    args = vars(parser.parse_args(argv))
    address, service, timeout = args.pop("address"), args.pop("service"), args.pop("timeout")
    try:
        config = from_dict(ClientConfig, {"max_retries": 0, **args})
    except ConfigError as exc:
        parser.error(str(exc))
    status = check(address, service, timeout, config)
    print(f"{address}{' ' + service if service else ''}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
