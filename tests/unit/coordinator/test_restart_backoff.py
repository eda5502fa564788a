"""Supervision's restart backoff: it doubles while restarts follow each other without a completed
step (a crash loop), and starts over once the run has completed a step since the last restart."""

from __future__ import annotations

from types import SimpleNamespace

from rollway.common.supervision.supervisor import DeadService
from rollway.coordinator.run_loop import _recover
from rollway.coordinator.run_record import RunRecord


class FakeGroup:
    def __init__(self):
        self.addresses = {"trainer": ["127.0.0.1:1"]}
        self.restarted: list[tuple[str, int]] = []

    def restart(self, name: str, index: int) -> str:
        self.restarted.append((name, index))
        return f"127.0.0.1:{len(self.restarted) + 1}"

    def rebuilt_by_restart(self) -> set[str]:
        return set()

    def placement_settings(self) -> dict[str, object]:
        return {}


class RecordedStop:
    """A stop event that is never set and records each wait (the backoff) instead of sleeping."""

    def __init__(self):
        self.waits: list[float] = []

    def is_set(self) -> bool:
        return False

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return False


def driver(steps_done: int):
    """A stand-in for a Run: `last_step_metrics` is non-empty once it completed a step."""
    return SimpleNamespace(last_step_metrics={"train/loss": 1.0} if steps_done else {})


def test_the_backoff_doubles_in_a_crash_loop_and_starts_over_after_a_completed_step(tmp_path):
    coordinator = SimpleNamespace(max_restarts=10, restart_backoff_seconds=1.0)
    record = RunRecord(run_id="r", run=SimpleNamespace(coordinator=coordinator), run_dir=tmp_path)
    record.group, record.addresses, record.stop = FakeGroup(), {"trainer": ["127.0.0.1:1"]}, RecordedStop()
    dead = DeadService("trainer", 0, "(pid 1) exited with -9")

    record.driver = driver(steps_done=3)
    assert _recover(record, dead, RuntimeError("trainer died"))  # 1 s
    assert _recover(record, dead, RuntimeError("died again during Init"))  # same driver: 2 s
    record.driver = driver(steps_done=0)
    assert _recover(record, dead, RuntimeError("died before its first step"))  # 4 s
    record.driver = driver(steps_done=1)
    assert _recover(record, dead, RuntimeError("died after a step"))  # progress: 1 s again
    assert _recover(record, dead, RuntimeError("and again at once"))  # 2 s

    assert record.stop.waits == [1.0, 2.0, 4.0, 1.0, 2.0]
    assert record.num_restarts == 5
    assert record.group.restarted == [("trainer", 0)] * 5
    assert record.addresses["trainer"] == ["127.0.0.1:6"]
    assert [r["service"] for r in record.recoveries] == ["trainer"] * 5


def test_no_restart_past_max_restarts(tmp_path):
    coordinator = SimpleNamespace(max_restarts=1, restart_backoff_seconds=0.5)
    record = RunRecord(run_id="r", run=SimpleNamespace(coordinator=coordinator), run_dir=tmp_path)
    record.group, record.addresses, record.stop = FakeGroup(), {"trainer": ["127.0.0.1:1"]}, RecordedStop()
    dead = DeadService("trainer", 0, "(pid 1) exited with -9")
    assert _recover(record, dead, RuntimeError("died"))
    assert not _recover(record, dead, RuntimeError("died again"))
    assert record.stop.waits == [0.5]
    assert record.num_restarts == 1
