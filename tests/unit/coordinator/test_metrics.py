"""Metrics sinks: jsonl, TensorBoard events, followers, progress line, plots."""

import io
import threading

from rollway.coordinator.metrics import MetricsSink, ProgressLine
from rollway.coordinator.plot import plot_run
from rollway.coordinator.step_pace import StepPace, pace_of


def test_sink_writes_jsonl_tensorboard_and_feeds_followers(tmp_path):
    sink = MetricsSink(tmp_path)
    seen = []
    follower = threading.Thread(target=lambda: seen.extend(r["step"] for r in sink.follow(from_step=1)))
    follower.start()
    for step in range(3):
        sink.log(step, {"train/loss": 1.0 / (step + 1), "rollout/raw_reward": 0.1 * step})
    sink.close()
    follower.join(5)
    assert seen == [1, 2]
    records = MetricsSink.read(tmp_path / "metrics.jsonl")
    assert [r["train/loss"] for r in records] == [1.0, 0.5, 1.0 / 3]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    resumed = MetricsSink(tmp_path, tensorboard=False)
    assert resumed.last["step"] == 2
    plots = plot_run(tmp_path)
    assert {p.name for p in plots} == {"loss.png", "reward.png"}
    assert all(p.stat().st_size > 1000 for p in plots)


def test_a_follower_sees_the_steps_a_resume_redoes(tmp_path):
    """A resume truncates the records from its step and appends the redone steps where they were:
    a follower that had passed them sees them again instead of waiting for the list to regrow."""
    history = MetricsSink(tmp_path, tensorboard=False)
    for step in range(5):
        history.log(step, {"train/loss": 1.0})
    history.close()
    sink = MetricsSink(tmp_path, tensorboard=False)  # the recovered run's sink
    seen = []
    caught_up = threading.Event()

    def follow():
        for record in sink.follow():
            seen.append(record["step"])
            if len(seen) == 5:
                caught_up.set()

    follower = threading.Thread(target=follow)
    follower.start()
    assert caught_up.wait(5)
    sink.truncate_from(2)
    sink.log(2, {"train/loss": 0.5})
    sink.log(3, {"train/loss": 0.5})
    sink.close()
    follower.join(5)
    assert seen == [0, 1, 2, 3, 4, 2, 3]


def test_progress_line():
    out = io.StringIO()
    line = ProgressLine(10, stream=out).update(1, {"rollout/raw_reward": 0.25, "train/loss": 1.5})
    assert line.startswith("step 1/10 | reward 0.2500 | loss 1.5000 |")
    assert "ETA" in out.getvalue()


def test_time_per_step_is_wall_time_between_step_ends_as_the_records_were_written():
    """A resumed run's stream replays its earlier steps at once and a step may send several records:
    each record is timed by its own `time`, so the replay shows the pace the steps had."""
    progress = ProgressLine(300, stream=io.StringIO())
    for step in range(1, 201):  # the replayed history of a resumed run, received within milliseconds
        progress.update(step, {"sft/loss": 1.0, "perf/step_time": 0.2}, at=1000.0 + 0.25 * step)
        line = progress.update(step, {"eval/accuracy": 0.5}, at=1000.0 + 0.25 * step)  # a second record
    assert "| 0.25 s/step | ETA 0:00:25" in line  # 100 steps left at 0.25 s
    for step in range(201, 221):  # the window follows the live steps
        line = progress.update(step, {"sft/loss": 1.0, "perf/step_time": 0.2}, at=1050.0 + 0.5 * (step - 200))
    assert "| 0.50 s/step | ETA 0:00:40" in line


def test_a_slow_save_is_in_the_pace_and_the_eta():
    """perf/step_time is 1 s, but each step's checkpoint takes 2 s more before its record is
    written: the line shows the 3 s a step really takes, and the ETA at that pace."""
    progress = ProgressLine(10, stream=io.StringIO())
    line = progress.update(1, {"train/loss": 1.0, "perf/step_time": 1.0, "perf/save_time": 2.0}, at=103.0)
    assert "| 3.00 s/step | ETA 0:00:27" in line  # one step: its own time and its save
    for step in range(2, 5):
        line = progress.update(step, {"train/loss": 1.0, "perf/step_time": 1.0, "perf/save_time": 2.0},
                               at=100.0 + 3 * step)  # fmt: skip
    assert "| 3.00 s/step | ETA 0:00:18" in line


def test_a_redone_step_after_a_recovery_restarts_the_pace_from_it():
    """A recovery resumes from the last checkpoint: the steps it redoes replace their ends, and
    the time the recovery took is in the pace (it is in the run's duration too)."""
    pace = StepPace(10)
    for step in range(4):
        pace.add(step, 100.0 + step, {})
    pace.add(2, 120.0, {})  # step 2 redone after a recovery of ~17 s
    assert pace.ends == [(0, 100.0), (1, 101.0), (2, 120.0)]
    assert pace.seconds_per_step == 10.0
    assert pace.eta_seconds() == 70.0  # steps 3..9 left
    pace.add(10, 200.0, {"eval/accuracy": 1.0})  # the final evaluation is no step end
    assert pace.ends[-1] == (2, 120.0)


def test_no_pace_before_a_step_has_ended():
    pace = StepPace(10)
    assert pace.seconds_per_step is None and pace.eta_seconds() is None


def test_the_rl_progress_line_shows_the_loss_terms_not_a_zero_total():
    metrics = {
        "rollout/raw_reward": 0.5,
        "train/loss": 0.0,  # group-normalised advantages: ~0 on policy, whatever is learned
        "train/pg_loss": -2.5e-9,
        "train/kl_loss": 0.0125,
        "train/entropy_loss": 3.25,
        "train/pg_clipfrac": 0.0,
        "train/grad_norm": 0.75,
    }
    line = ProgressLine(10, stream=io.StringIO()).update(2, metrics)
    assert line.startswith(
        "step 2/10 | reward 0.5000 | pg_loss -2.500e-09 | kl_loss 0.0125 | entropy 3.2500 | "
        "clipfrac 0.0000 | grad_norm 0.7500 |"
    )
    assert "| loss " not in line


def test_a_resumed_attempt_prints_only_its_own_steps_and_paces_them_without_the_downtime():
    """`rollway run --resume`: the stream replays steps 1-4 of the earlier attempt (written before
    this attempt began at t=1000); the line shows steps 5.. only, and their pace is theirs."""
    out = io.StringIO()
    progress = ProgressLine(10, stream=out, since=1000.0)
    for step in range(1, 5):  # the earlier attempt, 10 s a step, replayed at once
        assert progress.update(step, {"sft/loss": 2.0, "perf/step_time": 10.0}, at=100.0 + 10 * step) is None
    line = progress.update(5, {"sft/loss": 1.0}, at=1003.0)  # no timer: the clock since the attempt began
    assert line.endswith("| 3.00 s/step | ETA 0:00:15")  # 3 s over 1 step of this attempt, 5 left
    for step in (6, 7):
        line = progress.update(step, {"sft/loss": 1.0}, at=1003.0 + 2 * (step - 5))
    assert line.endswith("| 2.00 s/step | ETA 0:00:06")  # not (1007 - 140) / 3 over the downtime
    assert [row.split(" |")[0] for row in out.getvalue().splitlines()] == [
        "step 5/10",
        "step 6/10",
        "step 7/10",
    ]


def test_the_pace_of_a_resumed_run_leaves_out_the_earlier_attempt():
    records = [{"step": s, "time": 100.0 + s} for s in range(4)] + [
        {"step": 4, "time": 1000.0},
        {"step": 5, "time": 1004.0},
    ]
    assert pace_of(records, 10).seconds_per_step == 180.8  # (1004 - 100) / 5: the downtime counted
    resumed = pace_of(records, 10, since=999.0)
    assert resumed.ends == [(4, 1000.0), (5, 1004.0)]
    assert resumed.seconds_per_step == 4.0 and resumed.eta_seconds() == 16.0


def test_an_eval_in_the_first_step_is_paced_apart_and_the_eta_counts_the_evals_to_come():
    """#37: a first step of 16 s began with a 60 s eval and the ETA extrapolated 76 s a step. The
    eval is its own figure: 16 s a step for 49 steps, and 60 s for each eval still to come
    (eval_interval 10: before steps 11, 21, 31, 41, counted from 1, and the final one)."""
    progress = ProgressLine(50, stream=io.StringIO(), eval_interval=10)
    first = {"rollout/raw_reward": 0.1, "eval/accuracy": 0.08, "perf/eval_time": 60.0, "perf/step_time": 16.0}
    line = progress.update(1, first, at=1076.0)
    assert line.endswith("| acc 0.0800 | 16.00 s/step | eval 60.0 s | ETA 0:18:04")  # 49 x 16 + 5 x 60
    for step in range(2, 12):  # step 11 began with the second eval, of 40 s
        evals = {"perf/eval_time": 40.0} if step == 11 else {}
        line = progress.update(
            step, {"perf/step_time": 15.0, **evals}, at=1076.0 + 15.0 * (step - 1) + 40.0 * (step >= 11)
        )
    assert "| 15.00 s/step | eval 40.0 s |" in line  # (ends 1076 -> 1266, less the 40 s eval) / 10
    assert line.endswith("ETA 0:13:05")  # 39 x 15 + 4 evals x 50 (the mean of 60 and 40)


def test_the_evals_to_come_follow_the_runs_own_schedule():
    from rollway.coordinator.eval_schedule import evaluates_before, num_evals_after

    for num_steps, interval in [(50, 10), (50, 0), (7, 3), (1, 1), (20, 20), (21, 20)]:
        for step in range(num_steps):
            expected = sum(evaluates_before(k, interval) for k in range(step + 1, num_steps)) + 1  # + final
            assert num_evals_after(step, num_steps, interval) == expected, (num_steps, interval, step)
    assert [k for k in range(25) if evaluates_before(k, 10)] == [0, 10, 20]
    assert num_evals_after(50, 50, 10) == 0


def test_a_final_eval_is_never_shown_as_a_step_of_a_longer_run():
    """`rollway run --resume` extending a 20-step run to 50: the earlier run's final eval (logged as
    step 21 counted from 1, eval metrics only) was printed "step 21/50 | acc 0.6100"."""
    out = io.StringIO()
    progress = ProgressLine(50, stream=out)
    line = progress.update(21, {"eval/accuracy": 0.61, "eval/add": 0.61, "perf/eval_time": 52.0}, at=100.0)
    assert line == "final eval after step 20 | acc 0.6100 | eval 52.0 s"
    assert progress.pace.ends == []  # no step's end either
    assert (
        ProgressLine(2, stream=out)
        .update(3, {"eval/accuracy": 0.5, "perf/eval_time": 1.0})
        .startswith("final eval after step 2 | acc 0.5000")
    )


def test_without_the_eval_interval_known_the_pace_still_leaves_a_measured_eval_out():
    pace = StepPace(10)  # the dashboard's pace of a run whose eval_interval it does not read
    pace.add(0, 100.0, {"perf/step_time": 3.0})
    pace.add(1, 130.0, {"perf/step_time": 28.0, "perf/eval_time": 25.0})
    assert pace.seconds_per_step == 5.0
