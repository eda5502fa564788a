"""Keeps every engine worker on the run's current weights while the RL loop runs.

    every interval:  rollout_i.GetInfo -> workers awaiting weights? -> under the weights lock:
                     rebuild the group, push the current version again (weight_sync.heal_engines)

Why a thread and not a check between steps: an SGLang server restarted by its rollout service
comes back while a rollout is being generated, and that rollout may need it (with one server,
nothing else can generate it). The weights lock keeps the push apart from a training step and
from the step's own sync, so the weights pushed are the version the engines are told they are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rollway.common.log import get_logger
from rollway.coordinator.remote import Services
from rollway.coordinator.weight_sync import WeightSyncSettings, heal_engines

log = get_logger("rollway.coordinator.engine_healer")


class EngineHealer:
    """A daemon thread calling heal_engines every `interval` seconds until stop()."""

    def __init__(
        self,
        services: Services,
        settings: WeightSyncSettings,
        weight_version: Callable[[], int],
        weights_lock: threading.Lock,
        interval: float = 2.0,
    ):
        self.services = services
        self.settings = settings
        self.weight_version = weight_version
        self.weights_lock = weights_lock
        self.interval = interval
        self.num_heals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-healer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with self.weights_lock:
                    if not self._stop.is_set() and heal_engines(
                        self.services, self.weight_version(), self.settings
                    ):
                        self.num_heals += 1
            except Exception as exc:  # the next round tries again; samples wait with deadlines
                log.warning("healing engine workers failed", error=f"{type(exc).__name__}: {exc}")
