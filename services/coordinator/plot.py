"""`rollway plot RUN_DIR`: PNG charts of a run's main curves from metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from rollway.coordinator.metrics import MetricsSink

# One chart per group; a group is drawn if any of its metrics was logged.
CHARTS = {
    "reward": ["rollout/raw_reward", "rollout/rewards"],
    "loss": ["train/loss", "train/pg_loss", "sft/loss", "sft/per_token_loss"],
    "eval": ["eval/accuracy"],
    "kl_and_clip": [
        "train/ppo_kl",
        "train/pg_clipfrac",
        "train/kl_loss",
        "train/train_rollout_logprob_abs_diff",
    ],
    "grad_norm": ["train/grad_norm", "sft/grad_norm"],
    "response_len": ["rollout/response_len/mean", "rollout/truncated_ratio"],
    "time": ["perf/step_time", "perf/rollout_time", "perf/train_time", "perf/weight_sync_time"],
}


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write one PNG per chart group present in RUN_DIR/metrics.jsonl; returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = MetricsSink.read(run_dir / "metrics.jsonl")
    if not records:
        raise FileNotFoundError(f"no metrics in {run_dir / 'metrics.jsonl'}")
    out = Path(out_dir or run_dir / "plots")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for chart, names in CHARTS.items():
        series = {n: [(r["step"], r[n]) for r in records if n in r] for n in names}
        series = {n: points for n, points in series.items() if points}
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, points in series.items():
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=name)
        ax.set_xlabel("step")
        ax.set_title(f"{run_dir.name}: {chart}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{chart}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
