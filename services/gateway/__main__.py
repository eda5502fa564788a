"""python -m rollway.gateway (`rollway gateway`): serve the Tinker API on loopback."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
from pathlib import Path

from rollway.common.config import parse
from rollway.gateway.config import GatewayConfig


def api_keys(config: GatewayConfig) -> dict[str, str] | None:
    """{API key: tenant}: --token (or ROLLWAY_GATEWAY_TOKEN) as tenant 'default', plus --tokens-file;
    a generated key when neither gives one. None (after saying why) for a key the SDK would refuse."""
    keys: dict[str, str] = {}
    token = config.token or os.environ.get("ROLLWAY_GATEWAY_TOKEN", "")
    if token:
        keys[token] = "default"
    if config.tokens_file:
        for tenant, key in json.loads(Path(config.tokens_file).read_text()).items():
            if key in keys:
                print(f"tokens_file: tenant {tenant!r} reuses another tenant's key", file=sys.stderr)
                return None
            keys[key] = tenant
    if not keys:
        generated = f"tml-rollway-{secrets.token_urlsafe(24)}"
        print(f"no --token given; clients use TINKER_API_KEY={generated}", file=sys.stderr)
        keys[generated] = "default"
    bad = [tenant for key, tenant in keys.items() if not key.startswith("tml-")]
    if bad:
        print(
            f"the API key of {bad[0]!r} must start with 'tml-' (the tinker SDK refuses other keys)",
            file=sys.stderr,
        )
        return None
    return keys


def main(argv=None) -> int:
    config = parse(GatewayConfig, argv, prog="rollway gateway", description=__doc__)
    import uvicorn  # after the config: `--help` and config errors are instant

    from rollway.common.log import configure_logging
    from rollway.common.parent_watch import watch_parent
    from rollway.gateway.app import create_app
    from rollway.gateway.gateway import Gateway

    configure_logging("gateway", config.log_format)
    keys = api_keys(config)
    if keys is None:
        return 2
    sock = socket.create_server((config.host, config.port))
    # Accepted connections inherit it: without it a reply's small writes wait for the client's
    # delayed ACK (~40 ms a call on Linux).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    port = sock.getsockname()[1]
    gateway = Gateway(config)
    server = uvicorn.Server(uvicorn.Config(create_app(gateway, keys), log_level="warning"))
    if config.port_file:
        tmp = Path(config.port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(config.port_file)  # atomic: a reader never sees a partial number
    print(f"rollway gateway: http://{config.host}:{port}", file=sys.stderr)
    # Started by a launcher or a test (ROLLWAY_PARENT_PID): gone with it. The kernel's SIGTERM (or
    # the watch's poll) ends the server as a SIGTERM from anyone does, and `close` stops the trainers.
    watch_parent(lambda _pid: setattr(server, "should_exit", True))
    try:
        server.run(sockets=[sock])
    finally:
        gateway.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
