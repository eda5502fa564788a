"""Opening datasets: read every row of every source once, check it, index it on disk.

Opening fails fast: the first bad row raises DataError naming the file, the row and the
problem, unless bad rows are skipped, in which case they are counted (and the first few
logged). A source left with no usable row is an error either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rollway.common.log import get_logger
from rollway.dataloader.readers import SourceError, read_rows
from rollway.dataloader.row_store import RowStore
from rollway.dataloader.rows import Row, RowProblem, RowRules, check_row
from rollway.dataloader.sources import SourceSpec

log = get_logger(__name__)

LOGGED_BAD_ROWS = 5


class DataError(Exception):
    """A dataset cannot be served as configured. The message names file, row and problem."""


@dataclass
class OpenedSource:
    """A source whose checked rows are indexed in `store`, in file order."""

    spec: SourceSpec
    store: RowStore
    num_rows: int  # rows in the slice, good or bad
    num_bad_rows: int  # rows skipped as bad (only with skip_bad_rows)

    def row(self, position: int) -> Row:
        """The position-th usable row."""
        return Row.from_json(self.store.get(position))

    def close(self) -> None:
        self.store.close()


def open_source(spec: SourceSpec, rules: RowRules, directory: Path, skip_bad_rows: bool) -> OpenedSource:
    """Read, check and index one source. Raises DataError."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    store = RowStore(Path(directory) / f"{spec.name}.rows")
    num_rows = num_bad = 0
    try:
        for raw in read_rows(spec, rules):
            num_rows += 1
            try:
                if raw.problem is not None:
                    raise raw.problem
                row = check_row(raw.values or {}, raw.index, rules)
            except RowProblem as problem:
                message = f"{spec.path}: {raw.location}: {problem}"
                if not skip_bad_rows:
                    raise DataError(message + " (--skip-bad-rows skips and counts such rows)") from None
                num_bad += 1
                if num_bad <= LOGGED_BAD_ROWS:
                    log.warning("skipped bad row", source=spec.name, problem=message)
                continue
            store.append(row.to_json())
    except SourceError as exc:
        store.close()
        raise DataError(str(exc)) from None
    except BaseException:
        store.close()
        raise
    store.seal()
    if len(store) == 0:
        store.close()
        what = f"all {num_rows} rows are bad" if num_rows else "no rows (empty file or slice)"
        raise DataError(f"{spec.spec}: {what}; nothing to serve")
    if num_bad:
        log.warning("skipped bad rows", source=spec.name, num_bad_rows=num_bad, num_rows=num_rows)
    return OpenedSource(spec, store, num_rows, num_bad)


def open_sources(
    specs: list[SourceSpec], rules: RowRules, directory: Path, skip_bad_rows: bool
) -> list[OpenedSource]:
    """Open every source (each in its own subdirectory); on error, close the ones already open."""
    opened: list[OpenedSource] = []
    try:
        for i, spec in enumerate(specs):
            opened.append(open_source(spec, rules, Path(directory) / str(i), skip_bad_rows))
    except BaseException:
        for source in opened:
            source.close()
        raise
    return opened
