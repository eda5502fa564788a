"""Loading the user's reward function from --custom-rm-path module:function (checked at start-up).

Accepted shapes (sync or async):
    def reward(sample) -> float                 # RewardSample
    def reward(args, sample) -> float           # Miles' signature; args is the RolloutConfig
and with --group-rm the same with a list of samples, returning one reward per sample.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from rollway.common.config import ConfigError, load_object
from rollway.rollout.rewards.types import RewardFunction


def _required_positional(fn) -> list[str]:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return ["*args"]
    return [p.name for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty]


def load_custom_reward(path: str, group: bool, args: Any) -> RewardFunction:
    """Import `module:function` and wrap it as the 'custom' reward; ConfigError naming the problem."""
    fn = load_object(path, "custom_rm_path")
    if not callable(fn):
        raise ConfigError("custom_rm_path", f"{path} is not callable (it is a {type(fn).__name__})")
    required = _required_positional(fn)
    what = "samples" if group else "sample"
    if required == ["*args"] or len(required) == 1:
        call = fn
    elif len(required) == 2:
        call = functools.partial(fn, args)
    else:
        raise ConfigError(
            "custom_rm_path",
            f"{path} must take ({what}) or (args, {what}); it takes ({', '.join(required) or 'nothing'})",
        )
    return RewardFunction(name="custom", fn=call, group=group)
