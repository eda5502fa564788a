"""Settings of the rollout service (flags are generated from the fields)."""

from dataclasses import dataclass


@dataclass
class RolloutConfig:
    """Rollout settings."""
