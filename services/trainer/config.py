"""Settings of the trainer service (flags are generated from the fields)."""

from dataclasses import dataclass


@dataclass
class TrainerConfig:
    """Trainer settings."""
