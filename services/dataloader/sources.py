"""Data sources as configured: `--prompt-data` (one path, or name path pairs) with optional weights.

A path may carry a row slice in Miles' syntax, `data.parquet@[100:200]` (Python slice bounds,
either may be empty or negative). Parsing is pure and happens once, when the config is
validated; whether the files exist and hold what they should is checked when they are opened.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FORMATS = {".parquet": "parquet", ".jsonl": "jsonl"}
_SLICE = re.compile(r"^(?P<path>.+)@\[(?P<start>[+-]?\d*):(?P<end>[+-]?\d*)\]$")


class SourceSpecError(ValueError):
    """A --prompt-data (or --eval-prompt-data) value is malformed."""


@dataclass(frozen=True)
class SourceSpec:
    """One configured source: its name, file, format, row slice and sampling weight."""

    name: str
    path: str  # the file, without the slice
    spec: str  # as written, slice included (for messages and Describe)
    format: str  # "parquet" or "jsonl"
    start: int | None = None
    end: int | None = None
    weight: float = 1.0

    def row_range(self, num_rows: int) -> range:
        """File rows selected by the slice, for a file of `num_rows` rows."""
        return range(num_rows)[slice(self.start, self.end)]


def parse_path(spec: str, name: str, weight: float = 1.0) -> SourceSpec:
    """Parse `path` or `path@[start:end]` into a SourceSpec."""
    path, start, end = spec, None, None
    match = _SLICE.match(spec)
    if match:
        path = match["path"]
        start = int(match["start"]) if match["start"] else None
        end = int(match["end"]) if match["end"] else None
    elif "@[" in spec:
        raise SourceSpecError(
            f"{spec!r}: malformed row slice; expected path@[start:end], e.g. data.parquet@[0:1000]"
        )
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise SourceSpecError(
            f"{path!r}: unsupported file type {suffix or '(none)'!r}; expected .parquet or .jsonl"
        )
    return SourceSpec(
        name=name, path=path, spec=spec, format=FORMATS[suffix], start=start, end=end, weight=weight
    )


def parse_sources(values: list[str], weights: list[float] | None = None) -> list[SourceSpec]:
    """`[path]` or `[name1, path1, name2, path2, ...]` (+ one weight per source) -> SourceSpecs.

    A single path is named after its file stem. Names must be unique: items, losses and
    rewards are reported per source name.
    """
    if not values:
        raise SourceSpecError("no data given")
    if len(values) == 1:
        pairs = [(Path(_SLICE.sub(r"\g<path>", values[0])).stem, values[0])]
    elif len(values) % 2:
        raise SourceSpecError(f"expects one path or name path pairs (got {len(values)} values)")
    else:
        pairs = list(zip(values[::2], values[1::2], strict=True))
    weights = list(weights or [])
    if weights and len(weights) != len(pairs):
        raise SourceSpecError(f"{len(pairs)} sources but {len(weights)} weights")
    if any(w < 0 for w in weights):
        raise SourceSpecError(f"weights must not be negative (got {weights})")
    if weights and sum(weights) <= 0:
        raise SourceSpecError("weights must not all be zero")
    specs = []
    for i, (name, spec) in enumerate(pairs):
        if not name or not re.fullmatch(r"[\w.\-]+", name):
            raise SourceSpecError(f"source name {name!r} must be letters, digits, '_', '-' or '.'")
        if Path(name).suffix.lower() in FORMATS:
            raise SourceSpecError(f"{name!r} looks like a file, not a source name; give name path pairs")
        specs.append(parse_path(spec, name, weights[i] if weights else 1.0))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SourceSpecError(f"source names must be unique (repeated: {', '.join(duplicates)})")
    return specs
