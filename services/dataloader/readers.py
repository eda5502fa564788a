"""Reading raw rows from parquet and jsonl files, a record batch at a time.

Parquet is read with `iter_batches` over the row groups the slice touches and only the columns
the rows need, so memory holds one record batch, never the whole file. jsonl is read line by
line; blank lines are not rows. Problems with the whole file (missing, unreadable, a missing
or mistyped column) raise SourceError; a problem with one row is yielded with that row so the
caller can fail or skip it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rollway.dataloader.rows import RowProblem, RowRules
from rollway.dataloader.sources import SourceSpec

BATCH_ROWS = 1024


class SourceError(Exception):
    """A whole file cannot be used. The message names the file and the problem."""


@dataclass
class RawRow:
    """One row as read: its index in the file, its values (or the problem), where it is."""

    index: int
    values: dict[str, Any] | None
    location: str
    problem: RowProblem | None = None


def read_rows(spec: SourceSpec, rules: RowRules) -> Iterator[RawRow]:
    """The rows of `spec`'s slice, in file order."""
    path = Path(spec.path)
    if not path.exists():
        raise SourceError(f"{spec.path}: file not found")
    if not path.is_file():
        raise SourceError(f"{spec.path}: not a file")
    if spec.format == "parquet":
        return _parquet_rows(spec, rules)
    return _jsonl_rows(spec)


def _open_parquet(spec: SourceSpec) -> pq.ParquetFile:
    try:
        # pre_buffer (pyarrow's default) would read every selected row group up front: the whole file.
        return pq.ParquetFile(spec.path, pre_buffer=False, buffer_size=1 << 20)
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(
            f"{spec.path}: not a readable parquet file (truncated or corrupt?): {exc}"
        ) from None


def check_parquet_schema(spec: SourceSpec, schema: pa.Schema, rules: RowRules) -> list[str]:
    """Check the columns a row needs exist and have usable types; return the columns to read."""
    names = schema.names
    required = [k for k in (rules.input_key, rules.label_key, rules.tool_key) if k]
    for key in required:
        if key not in names:
            raise SourceError(
                f"{spec.path}: missing key {key!r}: no such column (columns: {', '.join(names)})"
            )
    input_type = schema.field(rules.input_key).type
    is_text = pa.types.is_string(input_type) or pa.types.is_large_string(input_type)
    is_messages = (pa.types.is_list(input_type) or pa.types.is_large_list(input_type)) and pa.types.is_struct(
        input_type.value_type
    )
    if not (is_text or is_messages) or (rules.sft and is_text):
        expected = "a list of messages (list<struct<role, content>>)" if rules.sft else "a string or messages"
        raise SourceError(
            f"{spec.path}: wrong column type: {rules.input_key!r} is {input_type}; expected {expected}"
        )
    columns = list(required)
    if rules.metadata_key in names:
        meta_type = schema.field(rules.metadata_key).type
        if not (
            pa.types.is_struct(meta_type) or pa.types.is_string(meta_type) or pa.types.is_null(meta_type)
        ):
            raise SourceError(
                f"{spec.path}: wrong column type: metadata {rules.metadata_key!r} is {meta_type}; "
                "expected a struct or a JSON string"
            )
        columns.append(rules.metadata_key)
    return columns


def _parquet_rows(spec: SourceSpec, rules: RowRules) -> Iterator[RawRow]:
    parquet = _open_parquet(spec)
    columns = check_parquet_schema(spec, parquet.schema_arrow, rules)
    wanted = spec.row_range(parquet.metadata.num_rows)
    if not wanted:
        return
    groups, first_row, start = [], None, 0
    for g in range(parquet.num_row_groups):
        size = parquet.metadata.row_group(g).num_rows
        if start < wanted.stop and start + size > wanted.start:
            groups.append(g)
            first_row = start if first_row is None else first_row
        start += size
    index = first_row or 0
    try:
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=columns):
            for values in batch.to_pylist():
                if wanted.start <= index < wanted.stop:
                    yield RawRow(index, values, f"row {index}")
                index += 1
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{spec.path}: unreadable from row {index} on (corrupt?): {exc}") from None


def _count_jsonl_rows(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _jsonl_rows(spec: SourceSpec) -> Iterator[RawRow]:
    needs_count = any(b is not None and b < 0 for b in (spec.start, spec.end))
    total = _count_jsonl_rows(spec.path) if needs_count else None
    start, stop, _ = slice(spec.start, spec.end).indices(total if total is not None else 2**62)
    index = -1
    with open(spec.path, "rb") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            index += 1
            if index < start:
                continue
            if index >= stop:
                return
            location = f"row {index} (line {line_number})"
            try:
                values = json.loads(line)
            except ValueError as exc:
                yield RawRow(index, None, location, RowProblem(f"not valid JSON: {exc}"))
                continue
            if not isinstance(values, dict):
                problem = RowProblem(f"a JSON {type(values).__name__}, not an object")
                yield RawRow(index, None, location, problem)
                continue
            yield RawRow(index, values, location)
