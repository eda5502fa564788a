"""What a starting run is doing, a line each: the services it starts and the models they load.

At 0.6B a run's start took 13-120 s of silence (processes starting, the rollout engine and the
trainer reading the weights). These lines go to RunInfo.startup, which `rollway run` prints as
they come, and to the coordinator's log:

    starting dataloader, rollout, trainer ...
    services up in 9.8s
    loading /models/qwen3-0.6b (596.0M parameters, 2.38 GB float32) in trainer, rollout_0 ...
    services initialised in 13.4s (trainer 13.4s, rollout_0 0.3s, dataloader 0.1s)

The sizes come from the model's config.json (plan/shape.py), not its weights, so the line is
there before the loading starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rollway.coordinator.plan.shape import ModelShapeError, read_model_shape

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def model_size(hf_checkpoint: str, dtype: str) -> str:
    """'596.0M parameters, 2.38 GB float32' from config.json; '' where it cannot be read (the
    services' own checks name what is wrong with the model)."""
    try:
        num_params = read_model_shape(hf_checkpoint).num_params
    except (ModelShapeError, OSError):
        return ""
    size = f"{num_params / 1e6:.1f}M parameters"
    if dtype in ELEMENT_BYTES:
        size += f", {_decimal_bytes(num_params * ELEMENT_BYTES[dtype])} {dtype}"
    return size


def _decimal_bytes(num_bytes: int) -> str:
    """'2.38 GB', '4.1 MB': decimal units, as file sizes are shown."""
    return f"{num_bytes / 1e9:.2f} GB" if num_bytes >= 1e9 else f"{num_bytes / 1e6:.1f} MB"


def loading_line(hf_checkpoint: str, loaders: dict[str, str]) -> str:
    """The line before Init: which services load the model, with its size in each one's dtype
    (`loaders`: service name -> its dtype)."""
    by_dtype: dict[str, list[str]] = {}
    for name, dtype in loaders.items():
        by_dtype.setdefault(dtype, []).append(name)
    parts = []
    for dtype, names in by_dtype.items():
        size = model_size(hf_checkpoint, dtype)
        parts.append(f"{', '.join(names)}" + (f" ({size})" if size else ""))
    return f"loading {hf_checkpoint} in {'; '.join(parts)} ..."


def timed_line(what: str, seconds: float, parts: dict[str, float] | None = None) -> str:
    """'services initialised in 13.4s (trainer 13.4s, rollout_0 0.3s)', slowest first."""
    line = f"{what} in {seconds:.1f}s"
    if parts:
        slowest = sorted(parts.items(), key=lambda item: -item[1])
        line += " (" + ", ".join(f"{name} {took:.1f}s" for name, took in slowest) + ")"
    return line


class Stopwatch:
    """Seconds since it was made; `done(what)` reports a timed line through `report`."""

    def __init__(self, report: Callable[[str], None]):
        self.report = report
        self.started = time.monotonic()

    def done(self, what: str, parts: dict[str, float] | None = None) -> None:
        self.report(timed_line(what, time.monotonic() - self.started, parts))
