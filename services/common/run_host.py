"""Long-lived services serve run after run: which run holds a service, and that run's servicer.

    Init(run_id, settings) ─> RunHost.init ─ held by another run? ─────────> FAILED_PRECONDITION
                                  │ same run, same settings ──────────────> already_initialized
                                  │ same run, settings the run may change > update in place
                                  │ start-up servicer never used, same ──> adopted for the run
                                  └ otherwise: close the old servicer, build one for the run
    any other RPC ─> forwarded to the run's servicer (FAILED_PRECONDITION before any run configured
                     the service, or when the caller's x-rollway-run-id names another run)
    EndRun(run_id) ─> the service is free for the next run (its servicer is rebuilt by that run)

A service keeps everything it holds for a run (model and optimizer, data stream and batch ids,
weight group and version, caches and idempotency keys) in one servicer object built for that
run, so nothing of one run can leak into the next: a new run gets a new servicer. The servicer a
service builds from its start-up flags is adopted by the first run whose settings equal them,
so a service started with flags is ready at once and a bare one is configured by its first run.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import grpc

from rollway.common.errors import FailedPrecondition, InvalidArgument
from rollway.common.freed_memory import release_freed_memory
from rollway.common.log import get_logger

S = TypeVar("S")  # the per-run servicer
C = TypeVar("C")  # the service's settings dataclass

RUN_ID_METADATA = "x-rollway-run-id"


log = get_logger("rollway.common.run_host")


def caller_run_id(context: grpc.ServicerContext | None) -> str:
    """The run id a call carries in its metadata (empty when the caller names none)."""
    if context is None:
        return ""
    return dict(context.invocation_metadata() or ()).get(RUN_ID_METADATA, "")


class RunHost(Generic[S, C]):
    """The run holding a service and the servicer built for it.

    `build(settings)` makes a servicer for a run (slow: it may load a model); `close(servicer)`
    releases what it holds. `in_place(old, new)` says whether the holding run may move from
    settings `old` to `new` (dataclasses), and `update(servicer, new)` does that move; any other
    change within a run is refused (it would throw away what the run built).
    """

    def __init__(
        self,
        service: str,
        build: Callable[[C], S],
        close: Callable[[S], None],
        *,
        in_place: Callable[[C, C], bool] | None = None,
        update: Callable[[S, C], None] | None = None,
    ):
        self.service = service
        self._build = build
        self._close = close
        self._in_place = in_place or (lambda old, new: False)
        self._update = update or (lambda servicer, settings: None)
        self._lock = threading.RLock()
        self._servicer: S | None = None
        self._settings: C | None = None
        self._built_for: str | None = None  # the run the servicer was built for; None: start-up flags
        self._used = False
        self.holder: str = ""  # the run holding the service ("" while free)

    # --- start-up ---
    def adopt(self, servicer: S, settings: C) -> None:
        """Install the servicer built from the start-up flags (adopted by a first run with equal settings)."""
        with self._lock:
            self._servicer, self._settings, self._built_for, self._used = servicer, settings, None, False

    # --- runs ---
    def init(self, run_id: str, settings: C, *, rebuild: bool = False) -> tuple[S, bool, bool]:
        """Give the service to `run_id` with `settings`: (servicer, already_initialized, rebuilt).
        `rebuild`: a new servicer even for the same run and settings (a run recovering)."""
        with self._lock:
            self._refuse_other_run(run_id)
            current = self._servicer
            if rebuild:
                del current  # _rebuild frees the old servicer: no frame may keep it alive
                return self._rebuild(run_id, settings)
            if current is not None and not run_id and self._in_place(self._settings, settings):
                # A caller that names no run gets no isolation: it keeps configuring what is there.
                if settings == self._settings:
                    return current, True, False
                self._update(current, settings)
                self._settings = settings
                return current, False, False
            if current is not None and self._built_for == run_id:
                if settings == self._settings:
                    self._hold(run_id)
                    return current, True, False
                if not self._in_place(self._settings, settings):
                    raise InvalidArgument(
                        f"config.{_first_difference(self._settings, settings)}",
                        f"cannot be changed within run {run_id!r} (it rebuilds the {self.service}); "
                        "start a new run",
                    )
                self._update(current, settings)
                self._settings = settings
                self._hold(run_id)
                return current, False, False
            pristine = current is not None and self._built_for is None and not self._used
            if pristine and (settings == self._settings or self._in_place(self._settings, settings)):
                if settings != self._settings:
                    self._update(current, settings)
                self._built_for, self._settings = run_id, settings
                self._hold(run_id)
                return current, False, False
            del current
            return self._rebuild(run_id, settings)

    def _rebuild(self, run_id: str, settings: C) -> tuple[S, bool, bool]:
        current, self._servicer = self._servicer, None
        if current is not None:
            self._close(current)
            # The old run's model and buffers must be gone before the new run's load, or each run
            # leaves its own behind in the service's RSS (freed_memory.py says why both steps).
            del current
            release_freed_memory()
        servicer = self._build(settings)
        self._servicer, self._settings, self._built_for, self._used = servicer, settings, run_id, False
        self._hold(run_id)
        log.info("built for run", service=self.service, run_id=run_id)
        return servicer, False, True

    def end(self, run_id: str) -> bool:
        """End `run_id`'s hold (True if it held the service). Its servicer stays until the next run."""
        with self._lock:
            if not run_id or self.holder != run_id:
                return False
            self.holder = ""
        # What the run freed (activations, gradients, staging buffers) goes back to the OS now,
        # not when the next run starts: an idle service holds only its servicer.
        started = time.perf_counter()
        release_freed_memory()
        log.info(
            "run ended", service=self.service, run_id=run_id,
            release_seconds=round(time.perf_counter() - started, 3),
        )  # fmt: skip
        return True

    def _hold(self, run_id: str) -> None:
        # An empty run id (a client that names no run) configures the service without holding it.
        self.holder = run_id

    def _refuse_other_run(self, run_id: str) -> None:
        if self.holder and self.holder != run_id:
            raise FailedPrecondition(
                f"this {self.service} serves run {self.holder!r}; it takes another run once that run "
                f"ends (EndRun {self.holder!r} frees it)"
            )

    # --- calls ---
    def servicer(self, context: grpc.ServicerContext | None = None, *, uses: bool = True) -> S:
        """The servicer for a call, checked against the run the caller names. `uses`: the call may
        change what the servicer holds (a start-up servicer is then rebuilt for a later run)."""
        with self._lock:
            caller = caller_run_id(context)
            if caller and self.holder and caller != self.holder:
                raise FailedPrecondition(
                    f"this {self.service} serves run {self.holder!r}, not run {caller!r}"
                )
            if self._servicer is None:
                raise FailedPrecondition(
                    f"this {self.service} has no run yet: it was started without settings, and a "
                    "run's Init configures it"
                )
            self._used = self._used or uses
            return self._servicer

    @property
    def settings(self) -> C | None:
        return self._settings

    def current(self) -> S | None:
        """The servicer, without a caller check (for shutdown and health)."""
        return self._servicer

    def close(self) -> None:
        """Close the servicer (at service shutdown)."""
        with self._lock:
            servicer, self._servicer = self._servicer, None
        if servicer is not None:
            self._close(servicer)


def _first_difference(old: Any, new: Any) -> str:
    old_values, new_values = dataclasses.asdict(old), dataclasses.asdict(new)
    return next((k for k in old_values if old_values[k] != new_values[k]), "settings")


def run_scoped_servicer(
    base: type, descriptor: Any, host: RunHost, own: object, read_only: frozenset[str] = frozenset()
) -> object:
    """An instance of the generated servicer class `base` whose RPCs go to `host`'s servicer for
    the calling run, except the RPCs that `own` implements itself (Init, EndRun). RPCs named in
    `read_only` change nothing a run could see (GetInfo, Describe)."""

    def forward(name: str):
        uses = name not in read_only

        def rpc(self, request, context):
            return getattr(host.servicer(context, uses=uses), name)(request, context)

        rpc.__name__ = name
        return rpc

    methods = {
        name: (getattr(own, name) if hasattr(own, name) else forward(name))
        for name in descriptor.methods_by_name
    }
    methods = {
        name: (staticmethod(method) if hasattr(own, name) else method) for name, method in methods.items()
    }
    return type(f"RunScoped{base.__name__}", (base,), methods)()
