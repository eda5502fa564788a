"""Metrics sinks: jsonl, TensorBoard events, followers, progress line, plots."""

import io
import threading

from rollway.coordinator.metrics import MetricsSink, ProgressLine
from rollway.coordinator.plot import plot_run


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


def test_progress_line():
    out = io.StringIO()
    line = ProgressLine(10, stream=out).update(1, {"rollout/raw_reward": 0.25, "train/loss": 1.5})
    assert line.startswith("step 1/10 | reward 0.2500 | loss 1.5000 |")
    assert "ETA" in out.getvalue()


def test_time_per_step_is_the_runs_own_step_time_not_records_over_the_clock():
    """A resumed run's stream replays its earlier steps at once and a step may send several records:
    the line shows the steps' own wall time (perf/step_time), and evaluations keep the last figure."""
    progress = ProgressLine(300, stream=io.StringIO())
    for step in range(1, 201):  # the replayed history of a resumed run, received within milliseconds
        progress.update(step, {"sft/loss": 1.0, "perf/step_time": 0.25})
        line = progress.update(step, {"eval/accuracy": 0.5})  # a second record of the same step
    assert "| 0.25 s/step | ETA 0:00:25" in line  # 100 steps left at 0.25 s
    for step in range(201, 221):  # the window follows the live steps
        line = progress.update(step, {"sft/loss": 1.0, "perf/step_time": 0.5})
    assert "| 0.50 s/step | ETA 0:00:40" in line


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
