"""Which tenant (API key) made the request being served: set once per request by app.py from the
X-API-Key, read where the gateway records an owner (a session, a model, a sampler, a future) or
checks one. A tenant sees only what it owns; another's ids answer "not found", as unknown ids do."""

from __future__ import annotations

from contextvars import ContextVar

CALLER: ContextVar[str] = ContextVar("caller", default="")


def caller() -> str:
    """The tenant name of the request being served."""
    return CALLER.get()


def owns(owner: str) -> bool:
    return owner == CALLER.get()
