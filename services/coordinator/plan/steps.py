"""What a run will do, known before it starts: its number of steps, and whether its data is there.

End of data (Miles' rule): `num_rollout` > 0 runs exactly that many steps and the data loops over
as many epochs as that takes; `num_rollout: 0` runs `num_epoch` epochs, whose steps are computed
here from the data's row count: floor(num_epoch * rows / rollout_batch_size) full batches. Either
way the dataloader is told to loop (num_epoch 0 there), so a run never meets the end of its data
half-way through a step, and `RunInfo.num_steps` and `rollway plan` say the number up front.

The data files are checked from their metadata (parquet: schema and row count from the footer;
jsonl: the first row's keys and a line count), never by reading every row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rollway.dataloader.config import DataloaderConfig

# (setting, problem, precondition): precondition problems are about the world (a file missing),
# not the value; a request with only those is FAILED_PRECONDITION, else INVALID_ARGUMENT.
Problem = tuple[str, str, bool]


@dataclass
class DataShape:
    """The training data as the coordinator sees it: rows per source (None: not readable here)."""

    num_rows: int | None
    problems: list[Problem]


def check_data(data: DataloaderConfig) -> DataShape:
    """Every source's file exists and has the columns input_key and label_key name."""
    if not data.prompt_data:
        return DataShape(None, [])
    input_key, label_key = data.input_key, data.label_key
    try:
        specs = data.sources()
    except ValueError as exc:  # SourceSpecError: reported by the dataloader's own validation
        return DataShape(None, [("prompt_data", str(exc), False)])
    problems: list[Problem] = []
    total = 0
    for spec in specs:
        if not Path(spec.path).is_file():
            problems.append(("prompt_data", f"{spec.path}: no such file", True))
            continue
        try:
            columns, rows = _parquet_shape(spec.path) if spec.format == "parquet" else _jsonl_shape(spec.path)
        except Exception as exc:  # unreadable: named with the file, whatever the reader raised
            problems.append(("prompt_data", f"{spec.path}: not readable as {spec.format}: {exc}", True))
            continue
        total += len(spec.row_range(rows))
        for setting, key in (("input_key", input_key), ("label_key", label_key)):
            if key and columns is not None and key not in columns:
                problems.append(
                    (setting, f"{key!r} is no column of {spec.path} (columns: {', '.join(columns)})", False)
                )
    return DataShape(None if problems else total, problems)


def _parquet_shape(path: str) -> tuple[list[str], int]:
    import pyarrow.parquet as pq  # the footer only: schema and row count

    meta = pq.ParquetFile(path, pre_buffer=False).metadata
    return meta.schema.to_arrow_schema().names, meta.num_rows


def _jsonl_shape(path: str) -> tuple[list[str] | None, int]:
    rows, columns = 0, None
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            if columns is None:
                first = json.loads(line)
                columns = list(first) if isinstance(first, dict) else None
            rows += 1
    return columns, rows


def num_steps(num_rollout: int, num_epoch: int, rollout_batch_size: int, num_rows: int | None) -> int | None:
    """Steps the run will take (None: unknown here, the data is not readable by the coordinator)."""
    if num_rollout > 0:
        return num_rollout
    if num_rows is None or rollout_batch_size <= 0:
        return None
    return num_epoch * num_rows // rollout_batch_size


def end_of_data_text(num_rollout: int, num_epoch: int, rollout_batch_size: int, num_rows: int | None) -> str:
    """How the run's number of steps is settled, in words (`rollway plan`, RunInfo.end_of_data)."""
    rows = f"{num_rows} rows" if num_rows is not None else "rows not readable here"
    if num_rollout > 0:
        if not num_rows:
            return f"num_rollout {num_rollout} wins: the data ({rows}) loops over epochs where it runs out"
        epochs = num_rollout * rollout_batch_size / num_rows
        if epochs <= 1:  # one pass or less: no loop to speak of (#37: "loops over epochs, 0.16 epochs")
            return f"num_rollout {num_rollout} wins: it covers {epochs:.2f} of an epoch of the data ({rows})"
        return f"num_rollout {num_rollout} wins: the data ({rows}) loops over epochs, {epochs:.2f} epochs"
    steps = num_steps(0, num_epoch, rollout_batch_size, num_rows)
    return f"num_epoch {num_epoch} x {rows} / rollout_batch_size {rollout_batch_size} = {steps} steps"


def end_of_data_problems(
    num_rollout: int, num_epoch: int, rollout_batch_size: int, shape: DataShape
) -> list[Problem]:
    """num_rollout 0 needs a number of epochs and data the coordinator can count."""
    if num_rollout > 0 or shape.problems or rollout_batch_size <= 0:
        return []  # (a non-positive batch size is reported by the coordinator's validation)
    if num_epoch <= 0:
        return [
            (
                "num_epoch",
                "with num_rollout 0 the run lasts num_epoch epochs: give a positive num_epoch or a num_rollout",
                False,
            )
        ]
    if shape.num_rows is None:
        return [
            (
                "num_rollout",
                "0 (num_epoch epochs) needs prompt_data readable by the coordinator to count its steps; give num_rollout",
                False,
            )
        ]
    steps = num_epoch * shape.num_rows // rollout_batch_size
    if steps == 0:
        return [
            (
                "num_epoch",
                f"{num_epoch} epoch(s) of {shape.num_rows} rows make no full batch of rollout_batch_size {rollout_batch_size}",
                False,
            )
        ]
    return []
