"""What the dashboard reads of a run directory: metrics as they grow or are rewritten, progress."""

from __future__ import annotations

import json

from rollway.coordinator.dashboard import run_files
from rollway.coordinator.metrics import MetricsSink


def test_metrics_are_read_as_appended_and_again_when_a_resume_rewrites_them(tmp_path):
    sink = MetricsSink(tmp_path, tensorboard=False)
    for step in range(3):
        sink.log(step, {"train/loss": float(step)})
    first, count = run_files.read_metrics(tmp_path)
    assert ([r["step"] for r in first], count) == ([0, 1, 2], 3)
    with sink.path.open("a") as f:
        f.write(json.dumps({"step": 3, "time": 0.0})[:8])  # a record being written
    assert run_files.read_metrics(tmp_path, 2) == ([first[2]], 3)
    with sink.path.open("a") as f:
        f.write(json.dumps({"step": 3, "time": 0.0})[8:] + "\n")
    assert run_files.read_metrics(tmp_path)[1] == 4
    sink.truncate_from(1)  # a resumed run redoes steps 1.. (the file is replaced)
    assert [r["step"] for r in run_files.read_metrics(tmp_path)[0]] == [0]
    sink.close()


def test_progress_and_eta_from_the_records():
    records = [{"step": s, "time": 100.0 + 2 * s} for s in range(5)]
    assert run_files.progress(records, 10, "RUNNING") == {
        "step": 5, "num_steps": 10, "seconds_per_step": 2.0, "seconds_per_eval": None, "eta_seconds": 10.0,
    }  # fmt: skip
    final_eval = [*records, {"step": 10, "time": 500.0}]  # logged past the last step
    assert run_files.progress(final_eval, 10, "STOPPED")["eta_seconds"] is None
    assert run_files.progress(final_eval, 10, "STOPPED")["step"] == 5


def test_the_runs_status_paces_its_evaluations_apart_from_its_steps():
    """GetRun and the dashboard: steps of 2 s, each after an eval of 6 s (eval_interval 1): 2 s a
    step and 6 s an eval, 5 steps and 6 evals (the final one) to go."""
    records = [{"step": s, "time": 100.0 + 8 * s, "perf/eval_time": 6.0} for s in range(5)]
    progress = run_files.progress(records, 10, "RUNNING", eval_interval=1)
    assert (progress["seconds_per_step"], progress["seconds_per_eval"]) == (2.0, 6.0)
    assert progress["eta_seconds"] == 5 * 2.0 + 6 * 6.0


def test_the_dashboards_pace_counts_the_saves_between_steps():
    """Steps of 1 s each followed by a 4 s save: 5 s a step, not perf/step_time's 1 s."""
    records = [
        {"step": s, "time": 100.0 + 5 * s, "perf/step_time": 1.0, "perf/save_time": 4.0} for s in range(3)
    ]
    assert run_files.progress(records, 10, "RUNNING")["seconds_per_step"] == 5.0
    assert run_files.progress(records, 10, "RUNNING")["eta_seconds"] == 35.0
    assert run_files.progress(records[:1], 10, "RUNNING")["seconds_per_step"] == 5.0


def test_last_error_of_a_json_log():
    log = "\n".join(
        [
            json.dumps({"event": "listening", "level": "info"}),
            json.dumps({"event": "run failed", "level": "error", "error": "ValueError: boom"}),
            json.dumps({"event": "health", "level": "info"}),
        ]
    )
    assert run_files.last_error(log) == "run failed: ValueError: boom"
    assert run_files.last_error(json.dumps({"event": "fine", "level": "info"})) == ""
