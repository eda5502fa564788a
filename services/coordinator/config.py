"""Settings of the coordinator service (flags are generated from the fields)."""

from dataclasses import dataclass


@dataclass
class CoordinatorConfig:
    """Coordinator settings."""
