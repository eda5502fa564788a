"""When a run evaluates: before its first step, before each step that follows eval_interval steps,
and once after its last step (the final evaluation, logged as step num_steps).

The run (run.py) asks `evaluates_before` and the progress line's ETA counts the evaluations still
to come with `num_evals_after`: one formula for both, so the ETA counts the evaluations the run
will make.
"""

from __future__ import annotations


def evaluates_before(rollout_id: int, eval_interval: int) -> bool:
    """Whether the run evaluates just before step `rollout_id` (0-based) trains."""
    return rollout_id == 0 or (eval_interval > 0 and rollout_id % eval_interval == 0)


def num_evals_after(step: int, num_steps: int, eval_interval: int) -> int:
    """Evaluations still to come once step `step` (0-based) has ended: before each later step that
    evaluates, and the final one."""
    if step >= num_steps:
        return 0
    periodic = (num_steps - 1) // eval_interval - step // eval_interval if eval_interval > 0 else 0
    return periodic + 1
