"""Where rank 0 puts a save, and how a save that cannot write is reported (controller.py).

A save is written into a temporary directory under its root and renamed into place once complete
(checkpoint.finalize); a write that fails removes that directory and answers RESOURCE_EXHAUSTED
at once, naming the path and the error (not retried: a full disk stays full).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from rollway.common.errors import InvalidArgument, ResourceExhausted
from rollway.common.log import get_logger
from rollway.common.manifest import describe_os_error
from rollway.trainer import checkpoint

log = get_logger("rollway.trainer.controller")  # the controller's saves: logged under its name
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def make_temp_dir(root: Path, step: int) -> Path:
    """A new temporary directory for the save of `step` under `root` (created as needed)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint.temp_dir(root, step)
        tmp.mkdir()
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            raise write_failed(root, None, describe_os_error(exc)) from None
        raise InvalidArgument("path", f"cannot create a checkpoint under {root}: {exc}") from None
    return tmp


def warn_if_short_of_space(root: Path, last_checkpoint_bytes: int) -> None:
    """Warn before a save that will likely not fit: less free space than the last one took."""
    free = shutil.disk_usage(root).free
    if last_checkpoint_bytes and free < last_checkpoint_bytes:
        log.warning("less free space than the last checkpoint took", path=str(root), free_bytes=free,
                    last_checkpoint_bytes=last_checkpoint_bytes)  # fmt: skip


def write_failed(root: Path, tmp: Path | None, error: str) -> ResourceExhausted:
    """A save that could not write: remove its partial directory, log, and tell the caller at
    once (not retried: a full disk stays full)."""
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    log.error("checkpoint write failed", path=str(root), error=error, removed=str(tmp or ""))
    removed = f"; removed the partial {tmp}" if tmp is not None else ""
    return ResourceExhausted(f"checkpoint write failed under {root}: {error}{removed}", retry=False)
