"""Which run checkpoints under SAVE to delete so that at most `save_total_limit` remain.

The rule, in one place (`to_delete` is pure; `rotate` applies it to a directory):
- an unset limit (0) deletes nothing;
- only complete checkpoints (coordinator.json written) that are not newer than the one the latest
  pointer names are candidates: a directory without coordinator.json, or one newer than the
  pointer, is a save in progress (or one that stopped before moving the pointer) and is left to
  the code that owns it (`write_failure`, `remove_partial_dirs`);
- the newest `limit` of the candidates are kept, the one the pointer names always among them;
- a pointer that is missing or names no complete checkpoint deletes nothing: what a resume would
  use is then unclear, so nothing is taken from it;
- names in `protect` (the `load` checkpoint a run started from) are never deleted.
Older checkpoints are the resume's fallback past a corrupt newest one, so a limit of 1 gives up
that fallback; 2 or more keeps it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from rollway.common.log import get_logger
from rollway.common.manifest import PARTIAL_PREFIX, describe_os_error
from rollway.coordinator.run_state import LATEST_FILE, STATE_FILE

log = get_logger("rollway.coordinator.checkpoint_rotation")

PREFIX = "rollout_"


def to_delete(
    complete: Iterable[str], latest: str | None, limit: int, protect: Iterable[str] = ()
) -> list[str]:
    """Names among `complete` (run checkpoint directory names) to delete, oldest first.

    `latest` is the name the latest pointer holds (None: no pointer); `limit` 0 keeps all."""
    complete = sorted(set(complete))
    if limit <= 0 or latest is None or latest not in complete:
        return []
    candidates = [name for name in complete if name <= latest]  # newer: a save not finished
    kept = set(candidates[-limit:]) | {latest} | set(protect)
    return [name for name in candidates if name not in kept]


def rotate(save: str | Path, limit: int, protect: Iterable[str | Path] = ()) -> list[Path]:
    """Delete the run checkpoints under `save` that `to_delete` names; return them.

    `protect` may hold paths (a `load` directory); only those directly under `save` matter."""
    save = Path(save)
    if limit <= 0 or not save.is_dir():
        return []
    pointer = save / LATEST_FILE
    latest = pointer.read_text().strip() if pointer.is_file() else None
    complete = [p.name for p in save.glob(f"{PREFIX}*") if (p / STATE_FILE).is_file()]
    protected = {Path(p).name for p in protect if Path(p).resolve().parent == save.resolve()}
    deleted = []
    for name in to_delete(complete, latest, limit, protected):
        directory = save / name
        # Renamed first, atomically: a crash mid-delete leaves a partial directory, which resume
        # never reads and removes (remove_partial_dirs), not a complete one with files missing.
        doomed = directory.with_name(f"{PARTIAL_PREFIX}deleting-{name}")
        try:
            directory.rename(doomed)
        except OSError as exc:  # an old checkpoint left in place costs disk, not the run
            log.warning("old run checkpoint not deleted", path=str(directory), error=describe_os_error(exc))
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(directory)
    if deleted:
        log.info("old run checkpoints deleted", save_total_limit=limit, paths=[str(p) for p in deleted])
    return deleted
