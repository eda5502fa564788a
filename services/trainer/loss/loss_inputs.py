"""What a loss function gets: one micro-batch's per-target tensors (losses.py registers the losses)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rollway.trainer.config import TrainerConfig


@dataclass
class LossInputs:
    """A micro-batch's tensors at target positions ([rows, length])."""

    log_probs: torch.Tensor  # log p(target) under the current policy (requires grad)
    loss_mask: torch.Tensor  # float
    sample_index: torch.Tensor  # request index of the owning sample, -1 for none
    settings: TrainerConfig
    entropy: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # per-token inputs by Sample field
