"""Sessions end when their heartbeats stop (the gateway then releases their models)."""

from __future__ import annotations

from rollway.gateway.sessions import SessionTable


def test_a_session_expires_only_after_the_timeout_without_heartbeats():
    now = [0.0]
    table = SessionTable(timeout_s=10.0, clock=lambda: now[0])
    quiet, beating = table.create(), table.create()
    now[0] = 8.0
    assert table.heartbeat(beating.session_id)
    now[0] = 10.5
    assert [s.session_id for s in table.expire()] == [quiet.session_id]
    assert not table.heartbeat(quiet.session_id)  # over: a late heartbeat does not revive it
    now[0] = 17.9  # 9.9 s after its heartbeat
    assert table.expire() == []
    now[0] = 18.1
    assert [s.session_id for s in table.expire()] == [beating.session_id]
