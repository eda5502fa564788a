"""Durable files: atomic writes, fsync, and the sha256 manifest of a checkpoint directory.

A checkpoint is written into a temporary directory, fsynced, described by manifest.json (size
and sha256 of every file) and only then renamed into place; the `latest` pointer is replaced
atomically afterwards. A save killed half-way leaves a temporary directory that is never read.
Loading verifies every file against the manifest and names the first one that differs.

Used by the trainer (its checkpoints) and the coordinator (run checkpoints, which hold a trainer
checkpoint). A directory under the root that has its own manifest.json is described by that
manifest's hash alone: its files are verified by their owner, and never hashed twice.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

MANIFEST = "manifest.json"
PARTIAL_PREFIX = ".tmp-"  # a directory still being written (or left by a crash): never read
FORMAT = "rollway-trainer-checkpoint/1"  # the trainer's; a run checkpoint names its own


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt (the message names the file)."""


def tree_bytes(directory: Path) -> int:
    """Bytes of every file under `directory` (a checkpoint's size on disk, what the next save
    will need again)."""
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())


def remove_partial_dirs(root: Path) -> list[Path]:
    """Delete the partial directories (PARTIAL_PREFIX) under `root`, left by saves that crashed;
    the removed paths. Only while nothing saves under `root`."""
    found = (
        sorted(p for p in Path(root).rglob(f"{PARTIAL_PREFIX}*") if p.is_dir()) if Path(root).is_dir() else []
    )
    for path in found:
        shutil.rmtree(path, ignore_errors=True)
    return found


def describe_os_error(exc: OSError, path: Path | None = None) -> str:
    """'PATH: [Errno 28] No space left on device (ENOSPC)': the path (the error's, else `path`)
    and errno, for logs and callers."""
    name = errno.errorcode.get(exc.errno or 0, "")
    where = f"{exc.filename or path}: " if exc.filename or path else ""
    return f"{where}[Errno {exc.errno}] {exc.strerror or exc}" + (f" ({name})" if name else "")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (directories last, so entries are durable)."""
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            _fsync(Path(dirpath, name))
        _fsync(Path(dirpath))


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` so readers see the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(path.parent)


def _files(root: Path) -> list[str]:
    """Every file under `root` but its manifest; a nested manifest.json stands for its directory."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here != root and MANIFEST in filenames:
            found.append(str((here / MANIFEST).relative_to(root)))
            dirnames.clear()
            continue
        found += [
            str((here / name).relative_to(root)) for name in filenames if here / name != root / MANIFEST
        ]
    return sorted(found)


def write_manifest(root: Path, format_name: str = FORMAT) -> dict:
    """Describe every file under `root` in root/manifest.json (after all writers finished)."""
    files = {
        rel: {"size": (root / rel).stat().st_size, "sha256": file_sha256(root / rel)} for rel in _files(root)
    }
    manifest = {"format": format_name, "files": files}
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def verify_manifest(root: Path, format_name: str = FORMAT) -> dict:
    """Check every file listed in the manifest; raise CheckpointError naming the first bad one."""
    path = root / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (incomplete checkpoint)")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest ({exc})") from None
    if manifest.get("format") != format_name:
        raise CheckpointError(f"{path}: unknown format {manifest.get('format')!r} (expected {format_name})")
    for rel, expected in sorted(files.items()):
        file = root / rel
        if not file.is_file():
            raise CheckpointError(f"{file}: missing")
        if file.stat().st_size != expected["size"]:
            raise CheckpointError(f"{file}: size {file.stat().st_size} != {expected['size']} in the manifest")
        if file_sha256(file) != expected["sha256"]:
            raise CheckpointError(f"{file}: sha256 does not match the manifest (corrupt)")
    return manifest
