"""Demo addition datasets: documented schema, correct labels, held-out eval, determinism."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollway.demo.data import make_demo_data, split_pairs

MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
METADATA_TYPE = pa.struct([("a", pa.int64()), ("b", pa.int64())])


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return make_demo_data(tmp_path_factory.mktemp("demo"), seed=0, jsonl=True)


def _pairs_of_rl(path):
    return [(row["metadata"]["a"], row["metadata"]["b"]) for row in pq.read_table(path).to_pylist()]


def _pairs_of_sft(path):
    pairs = []
    for row in pq.read_table(path).to_pylist():
        question = row["messages"][0]["content"]  # "What is A + B?"
        a, b = question.removeprefix("What is ").removesuffix("?").split(" + ")
        pairs.append((int(a), int(b)))
    return pairs


def test_writes_the_documented_files_with_default_sizes(demo):
    assert set(demo) == {"sft", "rl", "eval", "sft_jsonl", "rl_jsonl", "eval_jsonl"}
    assert [demo[k].name for k in ("sft", "rl", "eval")] == ["sft.parquet", "rl.parquet", "eval.parquet"]
    assert pq.read_metadata(demo["sft"]).num_rows == 2000
    assert pq.read_metadata(demo["rl"]).num_rows == 1000
    assert pq.read_metadata(demo["eval"]).num_rows == 200


def test_sft_schema_and_messages(demo):
    table = pq.read_table(demo["sft"])
    assert table.schema.names == ["messages"]
    assert table.schema.field("messages").type == MESSAGES_TYPE
    for row in table.to_pylist():
        user, assistant = row["messages"]
        assert user["role"] == "user" and assistant["role"] == "assistant"
        a, b = user["content"].removeprefix("What is ").removesuffix("?").split(" + ")
        assert user["content"] == f"What is {a} + {b}?"
        assert assistant["content"] == str(int(a) + int(b))


@pytest.mark.parametrize("split", ["rl", "eval"])
def test_rl_schema_and_labels_are_correct_sums(demo, split):
    table = pq.read_table(demo[split])
    assert table.schema.names == ["prompt", "label", "metadata"]
    assert table.schema.field("prompt").type == pa.string()
    assert table.schema.field("label").type == pa.string()
    assert table.schema.field("metadata").type == METADATA_TYPE
    for row in table.to_pylist():
        a, b = row["metadata"]["a"], row["metadata"]["b"]
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert row["prompt"] == f"What is {a} + {b}?"
        assert row["label"] == str(a + b)


def test_splits_are_disjoint_and_eval_holds_out_both_orders(demo):
    sft, rl, held_out = _pairs_of_sft(demo["sft"]), _pairs_of_rl(demo["rl"]), _pairs_of_rl(demo["eval"])
    for pairs in (sft, rl, held_out):
        assert len(set(pairs)) == len(pairs)
    assert not set(sft) & set(rl)
    train = set(sft) | set(rl)
    assert not {frozenset(p) for p in held_out} & {frozenset(p) for p in train}


def test_jsonl_has_the_same_rows(demo):
    for split in ("sft", "rl", "eval"):
        lines = demo[f"{split}_jsonl"].read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == pq.read_table(demo[split]).to_pylist()


def test_same_seed_gives_identical_files_and_other_seeds_differ(tmp_path):
    first = make_demo_data(tmp_path / "a", seed=5, num_sft=50, num_rl=30, num_eval=20)
    second = make_demo_data(tmp_path / "b", seed=5, num_sft=50, num_rl=30, num_eval=20)
    other = make_demo_data(tmp_path / "c", seed=6, num_sft=50, num_rl=30, num_eval=20)
    for split in ("sft", "rl", "eval"):
        assert first[split].read_bytes() == second[split].read_bytes()
        assert first[split].read_bytes() != other[split].read_bytes()


def test_sizes_beyond_the_available_pairs_fail():
    sft, rl, held_out = split_pairs(seed=0, num_sft=7000, num_rl=0, num_eval=100)
    assert (len(sft), len(rl), len(held_out)) == (7000, 0, 100)
    with pytest.raises(ValueError, match="num_sft \\+ num_rl"):
        split_pairs(seed=0, num_sft=8000, num_rl=100, num_eval=100)


def test_negative_sizes_fail(tmp_path):
    with pytest.raises(ValueError, match="num_rl"):
        make_demo_data(tmp_path, num_rl=-1)
