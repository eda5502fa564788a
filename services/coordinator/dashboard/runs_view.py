"""The runs a dashboard shows: live runs of this coordinator (RunManager) and run directories.

Everything but a live run's state, its services and StopRun is read from the run's files, so the
dashboard needs nothing from the run thread but a look at its record (never a lock it holds).
"""

from __future__ import annotations

from pathlib import Path

from rollway.coordinator.dashboard import run_files


class DashboardRuns:
    """Run ids to directories (and live records); `manager` is None for `rollway dashboard`."""

    def __init__(
        self,
        manager=None,
        run_dirs: list[Path] = (),
        runs_root: Path | None = None,
        coordinator_address: str = "",
    ):
        self.manager = manager
        self.coordinator_address = coordinator_address  # gRPC address of the coordinator serving it
        self.run_dirs = [Path(d) for d in run_dirs]
        self.runs_root = Path(runs_root) if runs_root else None

    def _dirs(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        candidates = list(self.run_dirs)
        if self.runs_root is not None and self.runs_root.is_dir():
            candidates.append(self.runs_root)
        for directory in candidates:
            if is_run_dir(directory):
                found.setdefault(directory.name, directory)
            elif directory.is_dir():  # a folder of runs (a runs root)
                for child in sorted(directory.iterdir()):
                    if is_run_dir(child):
                        found.setdefault(child.name, child)
        return found

    def records(self) -> dict:
        if self.manager is None:
            return {}
        # Runs this coordinator drives; those it read from disk are shown from their files below.
        return {record.run_id: record for record in self.manager.list() if record.run is not None}

    def run_ids(self) -> list[str]:
        return list(dict.fromkeys([*self.records(), *self._dirs()]))

    def run_dir(self, run_id: str) -> Path:
        record = self.records().get(run_id)
        if record is not None:
            return Path(record.run_dir)
        directory = self._dirs().get(run_id)
        if directory is None:
            raise KeyError(run_id)
        return directory

    def live(self, run_id: str):
        return self.records().get(run_id)

    def summary(self, run_id: str) -> dict:
        """State, progress and ETA of one run."""
        record = self.live(run_id)
        run_dir = self.run_dir(run_id)
        if record is not None:
            state, error, total = record.state, record.error, record.config.num_rollout
            started = record.created
        else:
            state, error = run_files.finished_state(run_dir)
            total = run_files.num_steps(run_dir)
            config_file = run_dir / "config.json"
            started = config_file.stat().st_mtime if config_file.exists() else 0.0
        records, _ = run_files.read_metrics(run_dir)
        summary = {
            "run_id": run_id,
            "run_dir": str(run_dir),
            "state": state,
            "error": error,
            "notices": [n["notice"] for n in run_files.read_notices(run_dir)],  # recoveries, fallbacks
            "live": record is not None,
            "started": started,
            "mode": _mode(run_files.read_json(run_dir / "config.json")),
            **run_files.progress(records, total, state, eval_interval=run_files.eval_interval(run_dir)),
        }
        if record is not None and record.driver is not None:
            summary["step"] = record.driver.state.next_rollout_id
        return summary

    def stop(self, run_id: str, immediate: bool) -> dict:
        if self.live(run_id) is None:
            raise PermissionError(f"run {run_id} is not a live run of this coordinator")
        self.manager.stop(run_id, immediate=immediate)
        return self.summary(run_id)


def _mode(config: dict) -> str:
    coordinator = config.get("coordinator", {})
    if coordinator.get("loss_type") == "sft_loss":
        return "SFT"
    estimator = coordinator.get("advantage_estimator", "")
    return f"RL ({estimator})" if estimator else ""


def is_run_dir(path: Path) -> bool:
    return (path / "config.json").exists() or (path / "metrics.jsonl").exists()
