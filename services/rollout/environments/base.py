"""The environment interface of multi-turn rollouts (the plugin contract).

An environment runs one episode per sample. The rollout service calls

    env.reset(EpisodeStart)        once, with the prompt, its label and metadata
    env.step(ModelTurn) -> Step    after each model turn, until Step.done or a limit

and appends the step's observation to the sample as token ids (loss mask 0): `observation` text
as given, or `messages` rendered by the served model's chat template. `close()` is called once
the episode ends, however it ends. An exception from reset or step ends the episode with
FINISH_REASON_FAILED (the message lands in the sample's reward_error); the service carries on.

One instance serves one episode at a time; the service builds one per sample (factory call), so
an environment may keep per-episode state in attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EpisodeStart:
    """What an episode starts from."""

    prompt: str  # the prompt decoded from its token ids (chat template included)
    label: str
    metadata: dict[str, Any]
    prompt_token_ids: tuple[int, ...]
    # A continuation (partial rollout): the finished model turns are replayed through step() next.
    resumed: bool = False


@dataclass(frozen=True)
class ModelTurn:
    """One model turn: its text (special tokens skipped), token ids and why it ended."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" (end of turn) or "length" (--rollout-max-response-len)
    log_probs: tuple[float, ...] = ()  # rollout log-probs of token_ids (empty in a replay)
    weight_version: int = 0  # the weights that generated the turn's last part


@dataclass
class Step:
    """The environment's answer to a model turn."""

    observation: str = ""  # appended verbatim (tokenised alone, never re-tokenising the episode)
    messages: list[dict[str, str]] = field(default_factory=list)  # or rendered by the chat template
    reward: float = 0.0  # this turn's reward; the sample's reward is the episode's sum
    done: bool = False
    # Named metrics of the episode (e.g. the parts of a reward); a later step's value of a name
    # replaces an earlier one. They reach the sample (Sample.metrics) and the run's metrics as the
    # mean over the rollout's samples that report them, rollout/env/<name>.
    metrics: dict[str, float] = field(default_factory=dict)


class Environment(ABC):
    """A multi-turn environment (see the module doc)."""

    @abstractmethod
    def reset(self, start: EpisodeStart) -> None:
        """Begin an episode."""

    @abstractmethod
    def step(self, turn: ModelTurn) -> Step:
        """Answer the model's turn."""

    def episode_prompt_token_ids(self) -> tuple[int, ...] | None:
        """Optional: the prompt this episode really starts from, when the environment decides it
        during reset (an agent's first request); None keeps the sample's prompt."""
        return None

    def episode_cut(self, turn: ModelTurn) -> None:  # noqa: B027 (optional hook)
        """Optional: the model's last turn, cut by --rollout-max-response-len; the episode ends
        with FINISH_REASON_LENGTH without a step (an agent still gets the cut turn back)."""

    def interrupt(self) -> None:  # noqa: B027 (optional hook)
        """Optional, from another thread: the episode was ended from outside (abort, timeout)
        while reset or step may be running; one that waits on something outside (an agent) may
        return at once (reset without its prompt, step with an empty Step)."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """The episode is over (finished, aborted, failed or timed out)."""


class EnvironmentFailed(RuntimeError):
    """An environment failed in a way the rollout service reports as FINISH_REASON_FAILED."""
