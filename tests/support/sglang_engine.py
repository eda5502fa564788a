"""An SGLangEngine attached to protocol test peers (tests/unit/rollout/conftest.py's SGLangPeer)."""

from __future__ import annotations

from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.sglang import SGLangEngine


def start_sglang_engine(model_dir, *peers, **overrides) -> SGLangEngine:
    """Started engine using `peers` as its servers; health polling effectively off."""
    config = RolloutConfig(
        hf_checkpoint=str(model_dir),
        rollout_engine="sglang",
        sglang_urls=[p.url for p in peers],
        sglang_health_interval=3600,
        **overrides,
    )
    engine = SGLangEngine(config)
    engine.start()
    return engine
