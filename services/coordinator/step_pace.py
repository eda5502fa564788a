"""Seconds per step and the ETA, from when steps ended.

A step's own timer (perf/step_time) stops before its checkpoint is saved and leaves out the
evaluations and recoveries between steps: at 0.6B a checkpoint every step made the shown pace
5.7 s/step against 15.5 s of wall time. The pace here is wall time between the ends of steps
(each metrics record's `time`, stamped once the step's save is done), over the last
PACE_WINDOW steps, so everything the run spends between two steps counts, as it does in the
run's duration. The console's progress line and the dashboard share this one formula.

Evaluations are paced apart (#37: a first step with a 50-80 s eval in it showed an ETA of
1:28:21 for ~17 minutes of steps): the eval before a step (its record's perf/eval_time) is taken
out of the wall time between step ends, and the ETA is the remaining steps at that pace plus the
evaluations still to come (eval_schedule.py) at the recent evals' mean.

A resumed run's pace counts only the steps of this attempt (records written from `since` on, the
attempt's start): the downtime between attempts is no step's time, and the earlier attempt's
records, which a resumed run's stream replays, are not this attempt's pace.
"""

from __future__ import annotations

from rollway.coordinator.eval_schedule import num_evals_after

PACE_WINDOW = 20  # steps: recent enough to follow a change of pace, long enough to smooth it


class StepPace:
    """The ends of the last PACE_WINDOW steps and the evaluations between them, fed record by
    record (replayed ones included: a record carries the time it was written, not the time it was
    received); records written before `since` (an earlier attempt's) are left out."""

    def __init__(
        self, num_steps: int = 0, window: int = PACE_WINDOW, since: float = 0.0, eval_interval: int = 0
    ):
        self.num_steps = num_steps
        self.window = window
        self.since = since
        self.eval_interval = eval_interval
        self.ends: list[tuple[int, float]] = []  # (step, time) of each step's last record
        self.eval_seconds: dict[int, float] = {}  # perf/eval_time of the eval before a step, by step
        self.first_step_seconds: float | None = None  # the only figure before a second step ends

    def add(self, step: int, at: float, metrics: dict[str, float]) -> None:
        """One metrics record of `step` (0-based) written at unix time `at`."""
        if self.num_steps and step >= self.num_steps:
            return  # the final evaluation, logged past the last step
        if at < self.since:
            return  # an earlier attempt's step
        # A later record of the same step moves its end; a redone step (the run resumed from an
        # earlier checkpoint) drops the ends from it on.
        while self.ends and self.ends[-1][0] >= step:
            self.ends.pop()
        for later in [s for s in self.eval_seconds if s > step]:
            del self.eval_seconds[later]
        self.ends.append((step, at))
        del self.ends[: -(self.window + 1)]
        if "perf/eval_time" in metrics:
            self.eval_seconds[step] = metrics["perf/eval_time"]
            for old in sorted(self.eval_seconds)[: -self.window]:
                del self.eval_seconds[old]
        if metrics.get("perf/step_time"):
            self.first_step_seconds = metrics["perf/step_time"] + metrics.get("perf/save_time", 0.0)

    @property
    def seconds_per_step(self) -> float | None:
        """Wall seconds per step, evaluations left out; with one step ended, its own time and
        save; None before."""
        if len(self.ends) >= 2:
            (first_step, first_at), (last_step, last_at) = self.ends[0], self.ends[-1]
            evals = sum(t for s, t in self.eval_seconds.items() if first_step < s <= last_step)
            return max(last_at - first_at - evals, 0.0) / (last_step - first_step)
        return self.first_step_seconds

    @property
    def seconds_per_eval(self) -> float | None:
        """The mean of the recent evaluations' times (None: none seen in this attempt)."""
        if not self.eval_seconds:
            return None
        return sum(self.eval_seconds.values()) / len(self.eval_seconds)

    def eta_seconds(self) -> float | None:
        """Seconds until the run's work ends: the remaining steps at the current pace and the
        evaluations still to come, the final one included (None: no pace or no total)."""
        per_step = self.seconds_per_step
        if per_step is None or not self.num_steps or not self.ends:
            return None
        last = self.ends[-1][0]
        evals = num_evals_after(last, self.num_steps, self.eval_interval) * (self.seconds_per_eval or 0.0)
        return max(self.num_steps - 1 - last, 0) * per_step + evals


def pace_of(records: list[dict], num_steps: int, since: float = 0.0, eval_interval: int = 0) -> StepPace:
    """The pace of a run from its metrics records ({"step", "time", ...} in the order written),
    counting those written from `since` on (this attempt's)."""
    pace = StepPace(num_steps, since=since, eval_interval=eval_interval)
    for record in records:
        pace.add(record["step"], record["time"], record)
    return pace
