"""Structured logging: JSON lines by default, pretty on a TTY.

Context fields (service, rpc, run_id, step, weight_version) are bound with structlog's
contextvars, so every line logged while a request is handled carries them. The server
interceptor binds them from request metadata; `bind_run_context` binds them in a loop.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog
from structlog.contextvars import bind_contextvars, bound_contextvars, clear_contextvars

__all__ = ["configure_logging", "get_logger", "bind_run_context", "bound_contextvars", "clear_contextvars"]

LogFormat = Literal["auto", "json", "pretty"]
# Context fields propagated between services as gRPC metadata (x-rollway-<field>).
PROPAGATED_FIELDS = ("run_id", "step", "weight_version")


def configure_logging(service: str, log_format: LogFormat = "auto", level: str = "INFO") -> None:
    """Configure structlog and stdlib logging for a service process (call once, at start)."""
    pretty = log_format == "pretty" or (log_format == "auto" and sys.stderr.isatty())

    def add_service(_logger, _method, event: dict) -> dict:
        # Static, not a contextvar: threads (RPC handlers, loops) do not inherit contextvars.
        event.setdefault("service", service)
        return event

    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        add_service,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if pretty:
        processors.append(structlog.dev.ConsoleRenderer())
    else:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


def get_logger(name: str | None = None) -> Any:
    """A structlog logger; `name` is added as the `logger` field.

    The logger is a lazy proxy: module-level loggers created before configure_logging still
    render with the configuration in force when they log.
    """
    return _NamedLogger(name) if name else structlog.get_logger()


class _NamedLogger:
    """Binds `logger=name` on every call, against the configuration in force at that time."""

    def __init__(self, name: str):
        self._name = name

    def bind(self, **fields: Any):
        return structlog.get_logger().bind(logger=self._name, **fields)

    def __getattr__(self, method: str):
        return getattr(structlog.get_logger().bind(logger=self._name), method)


def bind_run_context(**fields: Any) -> None:
    """Bind run_id / step / weight_version (or other fields) to every later log line in this context."""
    bind_contextvars(**{k: v for k, v in fields.items() if v is not None})
