"""Entry-point helper shared by `python -m rollway.<service>` and `rollway serve <service>`.

Configuration is parsed before the service module is imported, so `--help` and configuration
errors are instant even for services that import torch.

    python -m rollway.trainer --config trainer.yaml          # only trainer settings (strict)
    python -m rollway.trainer --run-config run.yaml          # a whole run's config: the trainer's keys
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Sequence

from rollway.common.config import parse_components
from rollway.common.interceptors import RUNNING_HANDLERS
from rollway.common.process_exit import exit_without_teardown
from rollway.common.run_components import run_components
from rollway.common.server import PortInUseError, ServerConfig

# How long a stopped service waits for RPC handlers still unwinding before it exits.
HANDLERS_EXIT_SECONDS = 5.0
PORT_IN_USE_EXIT_CODE = 2  # a usage error, as argparse's


def run_config_keys() -> set[str]:
    """Every key a run config may hold: the fields (and aliases) of every run component."""
    keys: set[str] = set()
    for cls in run_components().values():
        for f in dataclasses.fields(cls):
            keys.add(f.name)
            keys.update(alias.replace("-", "_") for alias in f.metadata.get("aliases", ()))
    return keys


def run_service(service: str, config_classes: Sequence[type], argv: Sequence[str] | None = None) -> None:
    """Parse ServerConfig plus the service's own config, then call rollway.<service>.service.serve()."""
    server_config, *service_configs = parse_components(
        [ServerConfig, *config_classes],
        argv,
        prog=f"python -m rollway.{service}",
        description=f"Run the rollway {service} service.",
        run_config_keys=run_config_keys,
        require=False,  # a service started without its model is configured by its first run
    )
    module = importlib.import_module(f"rollway.{service}.service")
    try:
        code = module.serve(server_config, *service_configs)  # None, or a service's own exit code
    except PortInUseError as exc:  # an operator's mistake, said in one line (no traceback)
        print(f"rollway {service}: {exc.strerror}", file=sys.stderr, flush=True)
        exit_without_teardown(PORT_IN_USE_EXIT_CODE)
    # serve() returns once the service has drained, stopped its ranks and engines and flushed its
    # spans; an exit code it returns says why it stopped (a trainer whose ranks broke: 75).
    # Interpreter teardown is skipped: with a peer of a torch.distributed group gone (a killed
    # trainer rank, a dead weight-sync member), gloo's threads abort the process there
    # ("terminate called without an active exception"), and the exit status must say that the
    # service stopped cleanly. Handlers still unwinding (a join the stop cancelled) finish first.
    RUNNING_HANDLERS.wait_idle(HANDLERS_EXIT_SECONDS)
    exit_without_teardown(code or 0)
