"""The components whose settings make up one run config (the flat namespace of `rollway run`, a
service's --run-config, StartRun): the one list, by name, of their settings dataclasses.

Named by module here because the shared runtime sits below the services; their config modules
import no torch, so loading them is instant.
"""

from __future__ import annotations

import importlib

RUN_COMPONENTS = {
    "coordinator": ("rollway.coordinator.config", "CoordinatorConfig"),
    "dataloader": ("rollway.dataloader.config", "DataloaderConfig"),
    "rollout": ("rollway.rollout.config", "RolloutConfig"),
    "trainer": ("rollway.trainer.config", "TrainerConfig"),
}


def run_components() -> dict[str, type]:
    """Each run component's settings dataclass, by component name, in RUN_COMPONENTS' order."""
    return {
        name: getattr(importlib.import_module(module), cls) for name, (module, cls) in RUN_COMPONENTS.items()
    }
