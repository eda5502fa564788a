"""The `math` reward: math-verify's answer extraction and equivalence check.

The response is parsed with math_verify.parse (it prefers the last \\boxed{} answer, and also
reads LaTeX and plain expressions), the label likewise, and math_verify.verify decides
equivalence, so 1/2, 0.5 and \\frac{1}{2} all match. math-verify's own signal-based timeouts
only work on the main thread; they are turned off here and the reward runner enforces
--reward-timeout instead.
"""

from __future__ import annotations

import logging

from rollway.rollout.rewards.text_match import require_label
from rollway.rollout.rewards.types import RewardSample

# math-verify warns on every call that its own timeout is off; the runner enforces ours.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def math_reward(sample: RewardSample) -> float:
    from math_verify import parse, verify

    require_label(sample)
    gold = parse(sample.label, parsing_timeout=None) or parse(f"${sample.label}$", parsing_timeout=None)
    if not gold:
        raise ValueError(f"math: cannot parse the label {sample.label!r}")
    answer = parse(sample.response, parsing_timeout=None)
    return float(bool(answer) and verify(gold, answer, timeout_seconds=None))
