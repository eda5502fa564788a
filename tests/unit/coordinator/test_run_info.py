"""One run's record can never break ListRuns: a record that cannot be reported still answers
with its id, state and why."""

from __future__ import annotations

from pathlib import Path

from rollway.coordinator.run_history import INTERRUPTED, PastRun, read_run
from rollway.coordinator.run_record import RunRecord
from rollway.coordinator.service import run_info
from rollway.coordinator.v1 import coordinator_pb2


def past(tmp_path: Path, **overrides) -> PastRun:
    fields = dict(run_id="r", run_dir=tmp_path, state="SUCCEEDED", error="", step=2, num_steps=2,
                  created=1.0, finished=2.0)  # fmt: skip
    return PastRun(**{**fields, **overrides})


def test_a_record_that_cannot_be_reported_still_gives_id_state_and_why(tmp_path):
    info = run_info(RunRecord.from_disk(past(tmp_path, num_steps=2**70)))
    assert info.run_id == "r"
    assert info.state == coordinator_pb2.RUN_STATE_SUCCEEDED
    assert "cannot be reported: ValueError" in info.error
    fine = run_info(RunRecord.from_disk(past(tmp_path)), "http://127.0.0.1:1")
    assert (fine.step, fine.num_steps, fine.error) == (2, 2, "")
    assert fine.dashboard_url == "http://127.0.0.1:1/?run=r"


def test_a_run_dir_without_status_was_interrupted(tmp_path):
    (tmp_path / "config.json").write_text('{"coordinator": {"num_rollout": 7}}')
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0, "time": 1.0, "perf/step_time": 0.5, "sft/loss": 2.0}\n'
        '{"step": 1, "time": 2.0, "perf/step_time": 0.5, "sft/loss": 1.5}\n'
    )
    run = read_run(tmp_path)
    assert (run.state, run.error, run.step, run.num_steps) == ("FAILED", INTERRUPTED, 2, 7)
    assert run.last_metrics == {"perf/step_time": 0.5, "sft/loss": 1.5}
