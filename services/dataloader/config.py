"""Settings of the dataloader service (flags are generated from the fields)."""

from dataclasses import dataclass


@dataclass
class DataloaderConfig:
    """Dataloader settings."""
