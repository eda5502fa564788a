"""Client sessions and their heartbeats: a session silent for longer than the timeout is over,
and the gateway releases the models it created (their trainer processes stop)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from rollway.gateway.callers import owns
from rollway.gateway.errors import not_found


@dataclass
class Session:
    """A connected SDK client (one ServiceClient)."""

    session_id: str
    last_heartbeat: float
    owner: str  # the tenant (API key) that created it
    user_metadata: dict[str, str] = field(default_factory=dict)
    model_ids: set[str] = field(default_factory=set)
    sampling_session_ids: set[str] = field(default_factory=set)


class SessionTable:
    """Open sessions; `expire` ends those whose heartbeat stopped."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, owner: str = "", user_metadata: dict[str, str] | None = None) -> Session:
        session = Session(f"session-{uuid.uuid4().hex[:12]}", self.clock(), owner, dict(user_metadata or {}))
        with self._lock:
            self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            return self._sessions.get(session_id)

    def owned(self, session_id: str) -> Session:
        """An open session of the caller's (not_found otherwise: another tenant's reads as unknown)."""
        session = self.get(session_id)
        if session is None or not owns(session.owner):
            raise not_found(f"session_id: {session_id!r} is not an open session (it ended or timed out)")
        return session

    def all(self) -> list[Session]:
        """Open sessions, oldest first."""
        with self._lock:
            return list(self._sessions.values())

    def heartbeat(self, session_id: str) -> bool:
        """Record a heartbeat; False for a session that is unknown or already over."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None:
                session.last_heartbeat = self.clock()
            return session is not None

    def end(self, session_id: str) -> Session | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def expire(self) -> list[Session]:
        """Remove and return the sessions silent for longer than the timeout."""
        now = self.clock()
        with self._lock:
            silent = [s for s in self._sessions.values() if now - s.last_heartbeat > self.timeout_s]
            for session in silent:
                del self._sessions[session.session_id]
        return silent
