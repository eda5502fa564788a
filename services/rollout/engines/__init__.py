"""Inference engines, chosen by --rollout-engine through this explicit registry.

Implementations are imported when chosen, so the sglang engine never imports transformers'
model code and the hf engine never needs an HTTP client.
"""

from __future__ import annotations

from collections.abc import Callable

from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import Engine


def _hf(config: RolloutConfig) -> Engine:
    from rollway.rollout.engines.hf import HFEngine

    return HFEngine(config)


def _sglang(config: RolloutConfig) -> Engine:
    from rollway.rollout.engines.sglang import SGLangEngine

    return SGLangEngine(config)


ENGINES: dict[str, Callable[[RolloutConfig], Engine]] = {"hf": _hf, "sglang": _sglang}


def create_engine(config: RolloutConfig) -> Engine:
    """The engine named by config.rollout_engine (not started)."""
    try:
        factory = ENGINES[config.rollout_engine]
    except KeyError:
        raise ValueError(
            f"rollout_engine: unknown engine {config.rollout_engine!r}; known: {sorted(ENGINES)}"
        ) from None
    return factory(config)
