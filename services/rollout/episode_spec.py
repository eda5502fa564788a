"""What an episode is, as the rest of the rollout service sees it: its spec (request_validation.py
builds it), its limits, its outcome and turns, and the finish reasons only episodes have. The
EpisodeEngine runs them (episodes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rollway.rollout.environments.base import Environment, Step

FINISH_MAX_TURNS = "max_turns"
FINISH_MAX_TOKENS = "max_tokens"
FINISH_TURN_TIMEOUT = "turn_timeout"
FINISH_EPISODE_TIMEOUT = "episode_timeout"
FINISH_FAILED = "failed"
MODEL, ENVIRONMENT = "model", "environment"


@dataclass
class TurnRecord:
    role: str  # MODEL or ENVIRONMENT
    num_tokens: int
    weight_version: int = 0
    reward: float = 0.0


@dataclass(frozen=True)
class EpisodeSpec:
    """What a sample's episode needs besides its engine request (request_validation builds it)."""

    new_environment: Callable[[], Environment]
    label: str = ""
    metadata: dict = field(default_factory=dict)
    # A continuation (partial rollout): the response so far, its loss mask and turns.
    prefix_token_ids: tuple[int, ...] = ()
    prefix_log_probs: tuple[float, ...] = ()
    prefix_loss_mask: tuple[int, ...] = ()
    prefix_turns: tuple[TurnRecord, ...] = ()


@dataclass
class EpisodeOutcome:
    loss_mask: list[int]
    turns: list[TurnRecord]
    reward: float
    failure: str = ""  # why the environment failed (finish reason "failed")
    metrics: dict[str, float] = field(default_factory=dict)  # the steps' metrics, last value wins


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_total_tokens: int  # 0: only the model context
    max_context_len: int
    turn_timeout: float
    episode_timeout: float


class TextCodec:
    """What episodes need from the tokenizer (PromptEncoder provides it)."""

    def __init__(
        self, decode: Callable[[tuple[int, ...]], str], observation_ids: Callable[[Step], tuple[int, ...]]
    ):
        self.decode = decode
        self.observation_ids = observation_ids
