"""--prompt-data parsing: single paths, name path pairs, slices, weights."""

import pytest

from rollway.dataloader.sources import SourceSpecError, parse_path, parse_sources


def test_single_path_is_named_after_its_stem():
    (spec,) = parse_sources(["/data/gsm8k.parquet@[10:20]"])
    assert (spec.name, spec.path, spec.format, spec.start, spec.end) == (
        "gsm8k",
        "/data/gsm8k.parquet",
        "parquet",
        10,
        20,
    )
    assert spec.spec == "/data/gsm8k.parquet@[10:20]"
    assert spec.weight == 1.0


def test_name_path_pairs_with_weights():
    specs = parse_sources(["math", "a.jsonl", "code", "b.parquet@[:-5]"], [0.7, 0.3])
    assert [(s.name, s.path, s.format, s.weight) for s in specs] == [
        ("math", "a.jsonl", "jsonl", 0.7),
        ("code", "b.parquet", "parquet", 0.3),
    ]
    assert (specs[1].start, specs[1].end) == (None, -5)


@pytest.mark.parametrize(
    ("spec", "rows", "expected"),
    [
        ("f.jsonl", 10, range(0, 10)),
        ("f.jsonl@[2:5]", 10, range(2, 5)),
        ("f.jsonl@[-3:]", 10, range(7, 10)),
        ("f.jsonl@[:]", 4, range(0, 4)),
        ("f.jsonl@[8:100]", 10, range(8, 10)),
        ("f.jsonl@[5:2]", 10, range(5, 5)),
    ],
)
def test_row_range_follows_python_slicing(spec, rows, expected):
    assert parse_path(spec, "f").row_range(rows) == expected


@pytest.mark.parametrize(
    ("values", "weights", "problem"),
    [
        ([], None, "no data"),
        (["a", "x.jsonl", "y.jsonl"], None, "name path pairs"),
        (["a", "x.jsonl", "a", "y.jsonl"], None, "unique"),
        (["a", "x.csv"], None, "unsupported file type '.csv'"),
        (["a", "x.jsonl@[1:2"], None, "malformed row slice"),
        (["a", "x.jsonl@[a:b]"], None, "malformed row slice"),
        (["x.jsonl", "y.jsonl"], None, "looks like a file"),
        (["a", "x.jsonl", "b", "y.jsonl"], [1.0], "2 sources but 1 weights"),
        (["a", "x.jsonl", "b", "y.jsonl"], [1.0, -1.0], "must not be negative"),
        (["a", "x.jsonl", "b", "y.jsonl"], [0.0, 0.0], "must not all be zero"),
        (["a b", "x.jsonl"], None, "must be letters"),
    ],
)
def test_malformed_specs_are_refused_with_the_problem(values, weights, problem):
    with pytest.raises(SourceSpecError, match=problem.replace("(", r"\(").replace("[", r"\[")):
        parse_sources(values, weights)
