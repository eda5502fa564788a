"""Seconds per step and the ETA, from when steps ended.

A step's own timer (perf/step_time) stops before its checkpoint is saved and leaves out the
evaluations and recoveries between steps: at 0.6B a checkpoint every step made the shown pace
5.7 s/step against 15.5 s of wall time. The pace here is wall time between the ends of steps
(each metrics record's `time`, stamped once the step's save is done), over the last
PACE_WINDOW steps, so everything the run spends between two steps counts, as it does in the
run's duration. The console's progress line and the dashboard share this one formula.

Evaluations are taken out of the pace and counted apart: a run that evaluates before its first
step and every eval_interval steps would otherwise show the first step's evaluation as the pace of
every step (SmolLM2: a 1:28:21 ETA for ~17 minutes of steps). The ETA is the steps left at the
pace without evaluations, plus the evaluations still to come (every eval_interval-th step and the
final one) at the mean time of those measured (perf/eval_time).

A resumed run's pace counts only the steps of this attempt (records written from `since` on, the
attempt's start): the downtime between attempts is no step's time, and the earlier attempt's
records, which a resumed run's stream replays, are not this attempt's pace.
"""

from __future__ import annotations

PACE_WINDOW = 20  # steps: recent enough to follow a change of pace, long enough to smooth it


class StepPace:
    """The ends of the last PACE_WINDOW steps, fed record by record (replayed ones included: a
    record carries the time it was written, not the time it was received); records written before
    `since` (an earlier attempt's) are left out."""

    def __init__(
        self, num_steps: int = 0, window: int = PACE_WINDOW, since: float = 0.0, eval_interval: int = 0
    ):
        self.num_steps = num_steps
        self.window = window
        self.since = since
        self.eval_interval = eval_interval  # 0: the run does not evaluate (or it is not known)
        self.ends: list[tuple[int, float]] = []  # (step, time) of each step's last record
        self.first_step_seconds: float | None = None  # the only figure before a second step ends
        self.eval_seconds: dict[int, float] = {}  # step -> the seconds of the evaluation in it

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
        self.ends.append((step, at))
        del self.ends[: -(self.window + 1)]
        if metrics.get("perf/eval_time"):
            self.eval_seconds[step] = metrics["perf/eval_time"]
        if metrics.get("perf/step_time"):
            own = metrics["perf/step_time"] + metrics.get("perf/save_time", 0.0)
            self.first_step_seconds = max(own - self.eval_seconds.get(step, 0.0), 0.0)

    @property
    def seconds_per_step(self) -> float | None:
        """Wall seconds per step, evaluations left out; with one step ended, its own time and save;
        None before."""
        if len(self.ends) >= 2:
            (first_step, first_at), (last_step, last_at) = self.ends[0], self.ends[-1]
            evaluating = sum(t for s, t in self.eval_seconds.items() if first_step < s <= last_step)
            return max(last_at - first_at - evaluating, 0.0) / (last_step - first_step)
        return self.first_step_seconds

    def evaluations_left(self) -> int:
        """Evaluations still to come after the last step ended: at each later step that is a
        multiple of eval_interval, and the final one."""
        if not self.eval_interval or not self.num_steps or not self.ends:
            return 0
        later = range(self.ends[-1][0] + 1, self.num_steps)
        return sum(step % self.eval_interval == 0 for step in later) + 1

    def eta_seconds(self) -> float | None:
        """Seconds until the run ends: the steps left at the current pace and the evaluations left
        at their mean measured time (None: no pace or no total)."""
        per_step = self.seconds_per_step
        if per_step is None or not self.num_steps or not self.ends:
            return None
        steps = max(self.num_steps - 1 - self.ends[-1][0], 0) * per_step
        each = sum(self.eval_seconds.values()) / len(self.eval_seconds) if self.eval_seconds else 0.0
        return steps + self.evaluations_left() * each


def pace_of(records: list[dict], num_steps: int, since: float = 0.0) -> StepPace:
    """The pace of a run from its metrics records ({"step", "time", ...} in the order written),
    counting those written from `since` on (this attempt's)."""
    pace = StepPace(num_steps, since=since)
    for record in records:
        pace.add(record["step"], record["time"], record)
    return pace
