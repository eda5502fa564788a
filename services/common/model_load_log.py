"""The log lines around a service reading a model's weights: what it loads and how long it took.

    loading model  path=/models/qwen3-0.6b dtype=float32 checkpoint_bytes=2384000000
    model loaded   path=... num_params=596049920 num_bytes=2384199680 dtype=float32 seconds=13.4

Reading 0.6B parameters took 13-120 s; without these lines a service's log said nothing meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def checkpoint_bytes(path: str | Path) -> int:
    """Bytes of the weight files (safetensors, bin) in a model directory; 0 where there are none."""
    directory = Path(path)
    if not directory.is_dir():
        return 0
    return sum(f.stat().st_size for f in directory.iterdir() if f.suffix in (".safetensors", ".bin"))


@contextmanager
def logged_model_load(log, path: str | Path, dtype: str) -> Iterator[list]:
    """Logs "loading model" now and "model loaded" (parameters, bytes, seconds) at the end of the
    block, for the model the block appends to the yielded list."""
    log.info("loading model", path=str(path), dtype=dtype, checkpoint_bytes=checkpoint_bytes(path))
    started = time.monotonic()
    loaded: list = []
    yield loaded
    if loaded:
        params = list(loaded[0].parameters())
        log.info(
            "model loaded",
            path=str(path),
            dtype=dtype,
            num_params=sum(p.numel() for p in params),
            num_bytes=sum(p.numel() * p.element_size() for p in params),
            seconds=round(time.monotonic() - started, 2),
        )
