"""An OpenEnv environment built from OpenEnv's own base classes, served by its own create_app:
the demo's addition task as a two-try game (`python -m rollway.openenv_host
--openenv-app support.openenv_envs:app`)."""

from __future__ import annotations

import re
import threading
import uuid
from pathlib import Path

from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app


class AnswerAction(Action):
    message: str  # the model's turn


class VerdictObservation(Observation):
    message: str  # the text appended after the model's turn


WRONG_REWARD = -0.25  # so that an episode's reward tells how many answers it took


class AdditionEnvironment(Environment):
    """reset(label) holds the sum; each answer gets " Correct." (reward 1, done) or " Wrong, try
    again." (reward WRONG_REWARD), done after `max_tries` answers (metadata; default 2). With
    metadata["stuck_marker"]: a step touches that file and never answers (until killed; 120 s)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=uuid.uuid4().hex)
        self.label, self.max_tries, self.marker = "", 2, ""

    def reset(self, seed=None, episode_id=None, label: str = "", metadata: dict | None = None, **kwargs):
        metadata = metadata or {}
        self.label = label
        self.max_tries = int(metadata.get("max_tries", 2))
        self.marker = metadata.get("stuck_marker", "")
        self._state = State(episode_id=episode_id or self._state.episode_id, step_count=0)
        return VerdictObservation(message="", done=False, reward=0.0)

    def step(self, action: AnswerAction, timeout_s=None, **kwargs) -> VerdictObservation:
        self._state.step_count += 1
        if self.marker:
            Path(self.marker).touch()
            threading.Event().wait(120)
        numbers = re.findall(r"-?\d+", action.message)
        if numbers and numbers[-1] == self.label:
            return VerdictObservation(message=" Correct.", done=True, reward=1.0)
        done = self._state.step_count >= self.max_tries
        return VerdictObservation(message=" Wrong, try again.", done=done, reward=WRONG_REWARD)

    @property
    def state(self) -> State:
        return self._state


app = create_fastapi_app(AdditionEnvironment, AnswerAction, VerdictObservation, max_concurrent_envs=64)
