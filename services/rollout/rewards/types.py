"""What a reward function receives, and how a registered reward is described."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RewardSample:
    """One generated sample as a reward function sees it (Miles' Sample field names)."""

    prompt: str
    response: str
    label: str
    metadata: dict[str, Any] = field(default_factory=dict)
    prompt_token_ids: tuple[int, ...] = ()
    response_token_ids: tuple[int, ...] = ()
    finish_reason: str = "stop"
    group_index: int = 0
    index: int = 0
    source: str = ""


@dataclass(frozen=True)
class RewardFunction:
    """A registered reward. `group`: fn(list[RewardSample]) -> list[float]; else fn(RewardSample) -> float."""

    name: str
    fn: Callable[..., Any]
    group: bool = False
