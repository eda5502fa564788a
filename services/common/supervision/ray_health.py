"""How long Ray's GCS takes to declare a node dead, from its health-check settings (the cluster's
system config): the one place this arithmetic lives, for rollway's supervision (ray_nodes) and the
test cluster (rollway.deploy.netns_cluster). Standard library only.

The GCS declares a node dead after `health_check_failure_threshold` checks in a row fail, each sent
`health_check_period_ms` after the last one's answer, failing after `health_check_timeout_ms`. A
killed node refuses at once (threshold x period: 15 s by default); a cut-off one fails by timeouts
(threshold x (period + timeout): 65 s by default).
"""

from __future__ import annotations

from collections.abc import Mapping

RAY_HEALTH_CHECK_DEFAULTS = {
    "health_check_failure_threshold": 5,
    "health_check_period_ms": 3000,
    "health_check_timeout_ms": 10000,
}
# A node silent for long may still be declared dead after its link is back (TCP's retransmission
# backoff keeps it silent a while longer, so Ray's health checks of it keep failing): with Ray's
# defaults, measured 55-65 s after it went quiet for a 40 s cut; a 10 s cut was never declared
# dead. A spell of 20 s in 65 is taken as long.
LONG_SPELL_FRACTION = 20.0 / 65.0


def silent_verdict_s(system_config: Mapping[str, object] | None = None) -> float:
    """The longest Ray takes to declare a cut-off node dead (65 s with the defaults)."""
    config = {**RAY_HEALTH_CHECK_DEFAULTS, **(system_config or {})}
    period_ms, timeout_ms = config["health_check_period_ms"], config["health_check_timeout_ms"]
    return config["health_check_failure_threshold"] * (period_ms + timeout_ms) / 1000.0


def long_spell_s(silent_verdict: float) -> float:
    """A silent spell this long may end in Ray's verdict after the node answers again (20 s of 65)."""
    return LONG_SPELL_FRACTION * silent_verdict
