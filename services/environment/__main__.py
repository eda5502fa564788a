"""python -m rollway.environment: serve an environment over gRPC (service.py)."""

from rollway.common.config import parse_components
from rollway.common.server import ServerConfig


def main(argv=None) -> None:
    from rollway.environment.service import EnvironmentServiceConfig, serve

    server_config, config = parse_components(
        [ServerConfig, EnvironmentServiceConfig],
        argv,
        prog="python -m rollway.environment",
        description="Serve a rollway environment (multi-turn rollouts) over gRPC.",
    )
    serve(server_config, config)


if __name__ == "__main__":
    main()
