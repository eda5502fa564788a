"""Entry-point helper shared by `python -m rollway.<service>` and `rollway serve <service>`.

Configuration is parsed before the service module is imported, so `--help` and configuration
errors are instant even for services that import torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from rollway.common.config import parse_components
from rollway.common.server import ServerConfig


def run_service(service: str, config_classes: Sequence[type], argv: Sequence[str] | None = None) -> None:
    """Parse ServerConfig plus the service's own config, then call rollway.<service>.service.serve()."""
    server_config, *service_configs = parse_components(
        [ServerConfig, *config_classes],
        argv,
        prog=f"python -m rollway.{service}",
        description=f"Run the rollway {service} service.",
    )
    module = importlib.import_module(f"rollway.{service}.service")
    module.serve(server_config, *service_configs)
