"""Serve a user's OpenEnv app (`python -m rollway.openenv_host --openenv-app module:attr`): the FastAPI app that OpenEnv's create_app / create_fastapi_app built, run unmodified
by uvicorn, as a process the coordinator starts, watches and restarts like its other services.

    --port 0 --port-file F   binds a free loopback port (SO_REUSEADDR: a restart takes the dead
                             one's port at once) and writes it to F once the app serves (/health)
    SIGTERM                  uvicorn's graceful shutdown; the launcher dying stops it too
"""

from __future__ import annotations

import asyncio
import importlib
import socket
from dataclasses import dataclass
from pathlib import Path

from rollway.common.config import ConfigError, parse_components, setting
from rollway.common.log import configure_logging, get_logger
from rollway.common.parent_watch import watch_parent
from rollway.common.server import ServerConfig

log = get_logger("rollway.openenv_server")
STARTED_POLL_SECONDS = 0.02


@dataclass
class OpenEnvServerConfig:
    """What the OpenEnv server process serves."""

    openenv_app: str = setting("", "module:attr of the OpenEnv app (create_app(...)) to serve")

    def validate(self) -> None:
        module, _, attr = self.openenv_app.partition(":")
        if not (module and attr):
            raise ConfigError(
                "openenv_app", f"must be module:attr of an OpenEnv app (got {self.openenv_app!r})"
            )


def load_app(path: str):
    module_name, _, attr = path.partition(":")
    try:
        app = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:
        raise ConfigError("openenv_app", f"cannot load {path!r}: {type(exc).__name__}: {exc}") from None
    if not callable(app):
        raise ConfigError("openenv_app", f"{path!r} is not an ASGI app (create_app's FastAPI app)")
    return app


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


async def _serve(server, sock: socket.socket, port_file: str) -> None:
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(STARTED_POLL_SECONDS)
    if server.started and port_file:
        tmp = Path(port_file + ".tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        tmp.replace(port_file)  # atomic: readers never see a partial number
        log.info("listening", port=sock.getsockname()[1])
    await serving


def serve(server_config: ServerConfig, config: OpenEnvServerConfig) -> None:
    import uvicorn

    if server_config.tls_cert or server_config.auth_token:
        raise ConfigError(
            "tls_cert" if server_config.tls_cert else "auth_token", "not supported for OpenEnv apps"
        )
    app = load_app(config.openenv_app)
    sock = _bind(server_config.host, server_config.port)
    server = uvicorn.Server(uvicorn.Config(app, log_level=server_config.log_level.lower(), lifespan="on"))

    def parent_gone(_pid: int) -> None:
        server.should_exit = True

    watch_parent(parent_gone)
    asyncio.run(_serve(server, sock, server_config.port_file))


def main(argv=None) -> None:
    server_config, config = parse_components(
        [ServerConfig, OpenEnvServerConfig],
        argv,
        prog="python -m rollway.openenv_host",
        description="Serve an OpenEnv environment app (create_app) over HTTP/WebSocket.",
    )
    configure_logging("openenv_server", server_config.log_format, server_config.log_level)
    serve(server_config, config)
