"""The environments bench_environments.py runs through each integration path: the same scripted
episode (step k answers " obs k." with reward 0.5, done after metadata["turns"] steps) as an
OpenEnv app and as an agent against the OpenAI-compatible endpoint, beside
tests/support/remote_environments.py's ScriptedEnvironment (rollway's plugin).

    python -m rollway.openenv_host --openenv-app bench.environment_paths:app
"""

from __future__ import annotations

import uuid

from openai import OpenAI
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app


class TurnAction(Action):
    message: str  # the model's turn


class TextObservation(Observation):
    message: str  # appended after the model's turn


class ScriptedOpenEnv(Environment):
    """ScriptedEnvironment's script, written against OpenEnv's classes."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=uuid.uuid4().hex)
        self.turns = 1

    def reset(self, seed=None, episode_id=None, metadata: dict | None = None, **kwargs):
        self.turns = int((metadata or {}).get("turns", 1))
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return TextObservation(message="", done=False, reward=0.0)

    def step(self, action: TurnAction, timeout_s=None, **kwargs) -> TextObservation:
        self._state.step_count += 1
        k = self._state.step_count
        return TextObservation(message=f" obs {k}.", done=k >= self.turns, reward=0.5)

    @property
    def state(self) -> State:
        return self._state


app = create_fastapi_app(ScriptedOpenEnv, TurnAction, TextObservation, max_concurrent_envs=256)


def scripted_agent(base_url: str, task) -> float:
    """The script as an agent with the official openai client: each reply is answered with the
    user turn " obs k.", until metadata["turns"] replies."""
    client = OpenAI(base_url=base_url, api_key=task.api_key or "none", max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    turns = int(task.metadata.get("turns", 1))
    for k in range(1, turns + 1):
        reply = client.chat.completions.create(model="policy", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        if k < turns:
            messages.append({"role": "user", "content": f" obs {k}."})
    return 0.5 * turns
