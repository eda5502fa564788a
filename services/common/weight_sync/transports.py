"""The transports of the weight-sync protocol, by the name a manifest carries.

Each side keeps its own registry of what runs a transport (rollway.trainer.weight_sync.registry,
rollway.rollout.weight_sync.registry); this table holds what the coordinator must know to drive
one, and no torch, so the coordinator imports it without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transport:
    """What the coordinator must know of a weight transport."""

    uses_group: bool  # bytes travel on the weight group: members join it first, receivers may acknowledge


TRANSPORTS = {"distributed": Transport(uses_group=True), "disk": Transport(uses_group=False)}
