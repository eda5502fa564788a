"""The `remote` reward: POST the sample as JSON to --rm-url (Miles' remote_rm).

Request body: {"prompt", "response", "label", "metadata"}. Reply: a JSON number, or an object
with a numeric "reward". Any other reply or HTTP status is an error for that sample.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from rollway.rollout.rewards.types import RewardSample


def remote_reward(url: str, timeout: float):
    """A reward function that asks the reward model at `url`."""

    def remote(sample: RewardSample) -> float:
        body = json.dumps(
            {
                "prompt": sample.prompt,
                "response": sample.response,
                "label": sample.label,
                "metadata": sample.metadata,
            }
        ).encode()
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                payload = json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode(errors="replace")
            raise RuntimeError(f"remote reward {url} answered HTTP {exc.code}: {detail}") from None
        if isinstance(payload, dict):
            payload = payload.get("reward")
        if isinstance(payload, bool) or not isinstance(payload, int | float):
            raise RuntimeError(f"remote reward {url} returned no number: {str(payload)[:200]}")
        return float(payload)

    return remote
