"""Environments the tests serve from a separate process (python -m rollway.environment
--environment custom --custom-generate-function-path support.remote_environments:ScriptedEnvironment)."""

from __future__ import annotations

import threading
from pathlib import Path

from rollway.rollout.environments.base import Environment, EpisodeStart, ModelTurn, Step


class ScriptedEnvironment(Environment):
    """Step k answers " obs k." with reward 0.5 and metric steps = k, done after metadata["turns"] steps. With
    metadata["stuck_marker"]: the first step touches that file and then never answers (until the
    process is killed; at most 120 s)."""

    def reset(self, start: EpisodeStart) -> None:
        self.turns = int(start.metadata.get("turns", 1))
        self.marker = start.metadata.get("stuck_marker", "")
        self.k = 0

    def step(self, turn: ModelTurn) -> Step:
        self.k += 1
        if self.marker:
            Path(self.marker).touch()
            threading.Event().wait(120)
        return Step(
            observation=f" obs {self.k}.",
            reward=0.5,
            done=self.k >= self.turns,
            metrics={"steps": float(self.k)},
        )
