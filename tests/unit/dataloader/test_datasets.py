"""Opening datasets: parquet and jsonl, slicing, whole-file errors, bad rows named or skipped."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.jsonl import write_jsonl

from rollway.dataloader.datasets import DataError, open_source
from rollway.dataloader.readers import SourceError, read_rows
from rollway.dataloader.rows import RowRules
from rollway.dataloader.sources import parse_path

RL = RowRules(input_key="prompt", label_key="label")
SFT = RowRules(input_key="messages", sft=True, apply_chat_template=True)


def rl_rows(n):
    return [{"prompt": f"question {i}", "label": str(i), "metadata": {"i": i}} for i in range(n)]


def write_parquet(path, rows, row_group_size=None):
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def test_parquet_slice_reads_only_the_row_groups_it_needs(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", rl_rows(100), row_group_size=7)
    rows = list(read_rows(parse_path(f"{path}@[30:45]", "d"), RL))
    assert [r.index for r in rows] == list(range(30, 45))
    assert [r.values["label"] for r in rows] == [str(i) for i in range(30, 45)]
    assert list(rows[0].values) == ["prompt", "label", "metadata"]


def test_jsonl_slice_counts_rows_not_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rl_rows(10)).replace("\n", "\n\n", 2) + "\n\n")
    rows = list(read_rows(parse_path(f"{path}@[-3:]", "d"), RL))
    assert [(r.index, r.values["label"]) for r in rows] == [(7, "7"), (8, "8"), (9, "9")]
    assert rows[0].location == "row 7 (line 10)"


def test_open_source_indexes_checked_rows_on_disk(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", rl_rows(50))
    source = open_source(parse_path(f"{path}@[10:20]", "d"), RL, tmp_path / "cache", skip_bad_rows=False)
    assert (source.num_rows, len(source.store), source.num_bad_rows) == (10, 10, 0)
    assert source.row(3).row_index == 13 and source.row(3).input == "question 13"
    assert source.row(3).metadata == {"i": 13}
    source.close()
    assert not source.store.path.exists()


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda d: d / "missing.parquet", "missing.parquet: file not found"),
        (
            lambda d: (d / "junk.parquet").write_bytes(b"not parquet at all") and d / "junk.parquet",
            "not a readable parquet",
        ),
        (
            lambda d: write_parquet(d / "c.parquet", [{"question": "q", "label": "1"}]),
            "missing key 'prompt': no such column",
        ),
        (
            lambda d: write_parquet(d / "t.parquet", [{"prompt": 1, "label": "1"}]),
            "wrong column type: 'prompt' is int64",
        ),
        (
            lambda d: write_parquet(d / "m.parquet", [{"prompt": "q", "label": "1", "metadata": 5}]),
            "wrong column type: metadata",
        ),
    ],
)
def test_whole_file_problems_name_the_file(tmp_path, make, problem):
    path = make(tmp_path)
    with pytest.raises(DataError, match=problem):
        open_source(parse_path(str(path), "d"), RL, tmp_path / "cache", skip_bad_rows=True)


def test_truncated_parquet_is_unreadable(tmp_path):
    good = write_parquet(tmp_path / "good.parquet", rl_rows(1000))
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(
        DataError, match=r"truncated.parquet: not a readable parquet file \(truncated or corrupt\?\)"
    ):
        open_source(parse_path(str(truncated), "d"), RL, tmp_path / "cache", skip_bad_rows=False)


def test_sft_parquet_needs_a_messages_column(tmp_path):
    path = write_parquet(tmp_path / "s.parquet", [{"messages": "hi"}])
    with pytest.raises(SourceError, match="expected a list of messages"):
        list(read_rows(parse_path(str(path), "s"), SFT))


def test_bad_row_fails_fast_naming_file_row_and_problem(tmp_path):
    rows = rl_rows(5)
    rows[3] = {"prompt": "q", "label": None}
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError) as info:
        open_source(parse_path(str(path), "d"), RL, tmp_path / "cache", skip_bad_rows=False)
    assert str(info.value).startswith(f"{path}: row 3 (line 4): label 'label' is null")


def test_skip_bad_rows_counts_them(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [json.dumps(r) for r in rl_rows(6)]
    lines[1] = "{not json"
    lines[2] = "[1, 2]"
    lines[4] = json.dumps({"label": "no prompt"})
    path.write_text("\n".join(lines) + "\n")
    source = open_source(parse_path(str(path), "d"), RL, tmp_path / "cache", skip_bad_rows=True)
    assert (source.num_rows, source.num_bad_rows, len(source.store)) == (6, 3, 3)
    assert [source.row(i).row_index for i in range(3)] == [0, 3, 5]


def test_a_source_without_usable_rows_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"label": "x"}])
    with pytest.raises(DataError, match="all 1 rows are bad"):
        open_source(parse_path(str(path), "d"), RL, tmp_path / "cache", skip_bad_rows=True)
    with pytest.raises(DataError, match="no rows"):
        open_source(parse_path(f"{path}@[5:]", "d"), RL, tmp_path / "cache", skip_bad_rows=True)


def test_corrupt_row_group_is_reported_with_the_rows_it_holds(tmp_path):
    path = write_parquet(
        tmp_path / "c.parquet", [{**r, "prompt": r["prompt"] * 5} for r in rl_rows(5000)], 1000
    )
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 300] = b"\xab" * 300  # footer intact, a data page garbled
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"c.parquet: unreadable from row \d+ on \(corrupt\?\)"):
        open_source(parse_path(str(path), "c"), RL, tmp_path / "cache", skip_bad_rows=True)
