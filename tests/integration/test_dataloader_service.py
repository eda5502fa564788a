"""The dataloader service over real gRPC: formats, loss masks, mixing, order, restore, prefetch, eval."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.jsonl import write_jsonl
from support.processes import ServiceProcess

from rollway.common.client import open_channel
from rollway.dataloader.v1 import dataloader_pb2 as pb
from rollway.dataloader.v1 import dataloader_pb2_grpc

QWEN_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "chat_templates" / "qwen_chatml.jinja"


def write_parquet(path: Path, rows: list[dict], row_group_size: int | None = None) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return str(path)


def conversation(i: int, turns: int) -> list[dict]:
    messages = [{"role": "system", "content": f"You are tutor number {i}."}] if i % 2 else []
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"What is {i} + {t}?"},
            {"role": "assistant", "content": f"The answer is {i + t}."},
        ]
    return messages


class Dataloader:
    """A dataloader process and a stub to it."""

    def __init__(self, tmp_path: Path, model_dir: Path, args: list[str]):
        self.process = ServiceProcess(
            "dataloader", ["--hf-checkpoint", str(model_dir), *args], tmp_path / "logs"
        )

    def __enter__(self) -> Dataloader:
        self.process.start()
        self.channel = open_channel(self.process.address)
        self.stub = dataloader_pb2_grpc.DataloaderServiceStub(self.channel)
        return self

    def __exit__(self, *exc) -> None:
        self.channel.close()
        self.process.stop()

    def batch(self, batch_id: int, batch_size: int) -> pb.NextBatchResponse:
        return self.stub.NextBatch(pb.NextBatchRequest(batch_id=batch_id, batch_size=batch_size))

    def keys(self, batch_ids: range, batch_size: int) -> list[tuple[str, int, int]]:
        return [(i.source, i.row_index, i.epoch) for b in batch_ids for i in self.batch(b, batch_size).items]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_rl_rows_from_parquet_and_jsonl_with_eval(tmp_path, tiny_model_dir, tokenizer):
    rows = [
        {"prompt": f"What is {i} + 1?", "label": str(i + 1), "metadata": {"a": i, "tag": "x"}}
        for i in range(30)
    ]
    chat = [
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Q{i}"}],
            "label": f"c{i}",
        }
        for i in range(5)
    ]
    parquet = write_parquet(tmp_path / "rl.parquet", rows, row_group_size=8)
    jsonl = write_jsonl(tmp_path / "chat.jsonl", chat)
    args = [
        "--prompt-data",
        "add",
        f"{parquet}@[10:30]",
        "chat",
        jsonl,
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--eval-prompt-data",
        "held_out",
        f"{parquet}@[:10]",
    ]
    with Dataloader(tmp_path, tiny_model_dir, args) as dl:
        response = dl.batch(0, 25)
        assert len(response.items) == 25 and response.counters["items_served"] == 25
        by_key = {(item.source, item.row_index): item for item in response.items}
        assert set(by_key) == {("add", i) for i in range(10, 30)} | {("chat", i) for i in range(5)}
        item = by_key[("add", 17)]
        messages = [{"role": "user", "content": "What is 17 + 1?"}]
        assert (
            list(item.prompt_token_ids)
            == tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        )
        assert item.label == "18" and dict(item.metadata) == {"a": 17.0, "tag": "x"}
        assert item.prompt_text == tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert not item.token_ids and not item.loss_mask
        chat_item = by_key[("chat", 3)]
        expected = tokenizer.apply_chat_template(chat[3]["prompt"], add_generation_prompt=True)["input_ids"]
        assert list(chat_item.prompt_token_ids) == expected and chat_item.label == "c3"

        # The tokenizer is loaded without torch (a dataloader needs none): no libtorch in the process.
        assert "libtorch" not in Path(f"/proc/{dl.process.pid}/maps").read_text()
        describe = dl.stub.Describe(pb.DescribeRequest())
        assert [(s.name, s.format, s.num_rows, s.num_usable_rows) for s in describe.sources] == [
            ("add", "parquet", 20, 20),
            ("chat", "jsonl", 5, 5),
        ]
        assert describe.mode == "rl" and describe.error == "" and describe.config["input_key"] == "prompt"
        assert [(s.name, s.num_rows) for s in describe.eval_sources] == [("held_out", 10)]

        first = dl.stub.EvalBatch(pb.EvalBatchRequest(name="held_out", offset=0, batch_size=6))
        rest = dl.stub.EvalBatch(pb.EvalBatchRequest(name="held_out", offset=first.next_offset, batch_size=6))
        assert [i.row_index for i in first.items] == list(range(6)) and not first.done
        assert (
            [i.row_index for i in rest.items] == list(range(6, 10)) and rest.done and rest.next_offset == 10
        )
        assert dl.stub.EvalBatch(pb.EvalBatchRequest(name="held_out", offset=0, batch_size=6)) == first
        with pytest.raises(grpc.RpcError) as info:
            dl.stub.EvalBatch(pb.EvalBatchRequest(name="nope", offset=0, batch_size=6))
        assert (
            info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            and "unknown eval source 'nope'" in info.value.details()
        )


def test_sft_loss_masks_match_apply_chat_template(tmp_path, tiny_model_dir, tokenizer):
    """A real-world (Qwen ChatML, system prompt) template from a file, multi-turn, parquet and jsonl."""
    parquet = write_parquet(
        tmp_path / "sft.parquet", [{"messages": conversation(i, 1 + i % 3)} for i in range(6)]
    )
    jsonl = write_jsonl(tmp_path / "sft.jsonl", [{"messages": conversation(10 + i, 3)} for i in range(4)])
    args = [
        "--prompt-data",
        "p",
        parquet,
        "j",
        jsonl,
        "--input-key",
        "messages",
        "--apply-chat-template",
        "--chat-template-path",
        str(QWEN_TEMPLATE),
        "--loss-type",
        "sft_loss",
    ]
    qwen = tokenizer.__class__.from_pretrained(str(tiny_model_dir))
    qwen.chat_template = QWEN_TEMPLATE.read_text()
    with Dataloader(tmp_path, tiny_model_dir, args) as dl:
        items = dl.batch(0, 10).items
        assert dl.stub.Describe(pb.DescribeRequest()).mode == "sft"
    assert len(items) == 10
    for item in items:
        messages = conversation(
            item.row_index + (10 if item.source == "j" else 0),
            3 if item.source == "j" else 1 + item.row_index % 3,
        )
        assert list(item.token_ids) == qwen.apply_chat_template(messages, tokenize=True)["input_ids"]
        assert len(item.loss_mask) == len(item.token_ids) and not item.prompt_token_ids
        masked = [t for t, m in zip(item.token_ids, item.loss_mask, strict=True) if m]
        answers = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        assert qwen.decode(masked) == "".join(answers)
        assert sum(item.loss_mask) == sum(
            len(qwen(a, add_special_tokens=False)["input_ids"]) for a in answers
        )


def test_weighted_sources_are_tagged_and_mixed_by_weight(tmp_path, tiny_model_dir):
    math = write_parquet(
        tmp_path / "math.parquet", [{"input": f"m{i}", "label": f"math-{i}"} for i in range(40)]
    )
    code = write_jsonl(tmp_path / "code.jsonl", [{"input": f"c{i}", "label": f"code-{i}"} for i in range(25)])
    args = [
        "--prompt-data",
        "math",
        math,
        "code",
        code,
        "--prompt-data-weights",
        "0.7",
        "0.3",
        "--label-key",
        "label",
        "--rollout-shuffle",
        "--num-epoch",
        "0",
        "--prefetch-size",
        "64",
    ]
    with Dataloader(tmp_path, tiny_model_dir, args) as dl:
        items = [item for b in range(10) for item in dl.batch(b, 64).items]
        counters = dl.batch(10, 1).counters
        weights = [s.weight for s in dl.stub.Describe(pb.DescribeRequest()).sources]
    assert weights == [0.7, 0.3]
    assert all(item.label.startswith(item.source + "-") for item in items)
    mix = Counter(item.source for item in items)
    assert abs(mix["math"] / len(items) - 0.7) < 0.02, mix
    # Each source wraps through its own epochs: the 25 code rows each appear once per code epoch.
    code_epoch0 = [item.row_index for item in items if item.source == "code" and item.epoch == 0]
    assert sorted(code_epoch0) == list(range(25))
    assert counters["items_served/math"] + counters["items_served/code"] == 641


def test_shuffle_is_determined_by_the_seed(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": f"row {i}"} for i in range(30)])
    base = ["--prompt-data", path, "--rollout-shuffle", "--num-epoch", "2"]
    streams = []
    for seed in ("1", "1", "2"):
        with Dataloader(tmp_path, tiny_model_dir, [*base, "--rollout-seed", seed]) as dl:
            streams.append(dl.keys(range(3), 20))
    assert streams[0] == streams[1]
    assert streams[0] != streams[2]
    for stream in streams:
        assert sorted(stream) == sorted([("d", i, e) for i in range(30) for e in (0, 1)])
        assert [row for _, row, _ in stream[:30]] != list(range(30))


def test_restore_continues_the_stream_mid_epoch_and_at_the_boundary(tmp_path, tiny_model_dir):
    a = write_parquet(tmp_path / "a.parquet", [{"input": f"a{i}"} for i in range(14)], row_group_size=4)
    b = write_jsonl(tmp_path / "b.jsonl", [{"input": f"b{i}"} for i in range(10)])
    args = ["--prompt-data", "a", a, "b", b, "--rollout-shuffle", "--num-epoch", "3", "--prefetch-size", "16"]
    states, stream = {}, []
    with Dataloader(tmp_path, tiny_model_dir, args) as dl:
        for batch_id in range(12):  # 12 x 6 = 3 epochs of 24 rows; batch 4 ends exactly at epoch 1
            if batch_id in (2, 4, 7):
                state = dl.stub.GetState(pb.GetStateRequest())
                states[batch_id] = state.state_json
                assert state.num_batches_served == batch_id
            response = dl.batch(batch_id, 6)
            stream.append([(i.source, i.row_index, i.epoch) for i in response.items])
            assert dl.batch(batch_id, 6) == response  # a retry returns the same batch
        assert response.exhausted and response.epoch == 3
    with Dataloader(tmp_path, tiny_model_dir, [*args[:-1], "0"]) as fresh:  # no prefetch this time
        for cut, state_json in states.items():
            epoch = fresh.stub.RestoreState(pb.RestoreStateRequest(state_json=state_json)).epoch
            assert epoch == (cut * 6) // 24
            resumed = [
                [(i.source, i.row_index, i.epoch) for i in fresh.batch(b, 6).items] for b in range(cut, 12)
            ]
            assert resumed == stream[cut:], f"restored at batch {cut}"
            assert fresh.stub.GetState(pb.GetStateRequest()).num_batches_served == 12


def test_prefetch_queue_depth_and_bad_requests(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": f"row {i}"} for i in range(200)])
    cache = tmp_path / "cache"
    args = ["--prompt-data", path, "--prefetch-size", "32", "--data-cache-dir", str(cache)]
    with Dataloader(tmp_path, tiny_model_dir, args) as dl:
        assert len(list(cache.glob("*/train/0/d.rows"))) == 1  # checked rows are indexed on disk
        batch_ids = itertools.count()
        deadline = time.monotonic() + 20
        while (depth := dl.batch(next(batch_ids), 1).prefetch_queue_depth) < 31:  # 32 ready, 1 taken
            assert time.monotonic() < deadline, depth
            time.sleep(0.05)
        for request, problem in [
            (pb.NextBatchRequest(batch_id=10**12, batch_size=0), "batch_size: must be in [1,"),
            (pb.NextBatchRequest(batch_id=10**12, batch_size=-3), "batch_size: must be in [1,"),
        ]:
            with pytest.raises(grpc.RpcError) as info:
                dl.stub.NextBatch(request)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and problem in info.value.details()
        for state_json, code in [
            ("", grpc.StatusCode.INVALID_ARGUMENT),
            ("{oops", grpc.StatusCode.INVALID_ARGUMENT),
            ('{"version": 1}', grpc.StatusCode.FAILED_PRECONDITION),
        ]:
            with pytest.raises(grpc.RpcError) as info:
                dl.stub.RestoreState(pb.RestoreStateRequest(state_json=state_json))
            assert info.value.code() == code and "state_json" in info.value.details()
        assert len(dl.batch(next(batch_ids), 3).items) == 3  # still serving
    assert list(cache.iterdir()) == []  # removed on shutdown
    with Dataloader(tmp_path, tiny_model_dir, ["--prompt-data", path, "--prefetch-size", "0"]) as dl:
        assert [dl.batch(b, 5).prefetch_queue_depth for b in range(3)] == [0, 0, 0]


def test_a_batch_id_outside_the_expected_range_is_refused_and_the_stream_goes_on(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": f"row {i}"} for i in range(40)])
    with Dataloader(tmp_path, tiny_model_dir, ["--prompt-data", path, "--rollout-shuffle"]) as dl:
        start = dl.stub.GetState(pb.GetStateRequest()).state_json
        served = dl.keys(range(2), 4)
        for bad_id, expected in [
            (10**12, "batch_id: 1000000000000 is outside the expected range: expected the next batch_id 2 "
                     "or a retry of batch_id 0..1 (the last 2 served)"),
            (-1, "batch_id: -1 is outside the expected range: expected the next batch_id 2"),
            (3, "batch_id: 3 is outside the expected range: expected the next batch_id 2"),
        ]:  # fmt: skip
            with pytest.raises(grpc.RpcError) as info:
                dl.batch(bad_id, 4)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details().startswith(expected), info.value.details()
        assert dl.stub.GetState(pb.GetStateRequest()).num_batches_served == 2
        served += dl.keys(range(2, 4), 4)
        # The same service, restored to its start, serves the undisturbed stream.
        dl.stub.RestoreState(pb.RestoreStateRequest(state_json=start))
        assert dl.keys(range(4), 4) == served
        assert len(set(served)) == 16
