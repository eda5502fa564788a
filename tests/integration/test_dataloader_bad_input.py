"""Bad datasets and rows: a clear error naming file, row and problem; the service stays up."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.processes import ServiceProcess

from rollway.common.client import open_channel
from rollway.dataloader.v1 import dataloader_pb2 as pb
from rollway.dataloader.v1 import dataloader_pb2_grpc

GOOD = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "2"}]
# The tiny ChatML template, refusing one word: a row the tokenizer side rejects.
PICKY_TEMPLATE = (
    "{%- for m in messages -%}{%- if 'FORBIDDEN' in m.content -%}{{ raise_exception('FORBIDDEN is not allowed') }}"
    "{%- endif -%}{%- if m.role == 'assistant' -%}{{- '<|im_start|>assistant\\n' -}}{% generation %}"
    "{{- m.content + '<|im_end|>' -}}{% endgeneration %}{{- '\\n' -}}{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
SFT = ["--input-key", "messages", "--apply-chat-template", "--mode", "sft"]
RL = ["--input-key", "prompt", "--label-key", "label"]


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def truncated(path: Path) -> Path:
    good = parquet(path.with_name("whole.parquet"), [{"prompt": f"q{i}", "label": "x"} for i in range(500)])
    path.write_bytes(good.read_bytes()[:-200])
    return path


def sft_rows(bad: dict, at: int = 2) -> list[dict]:
    rows = [{"messages": GOOD} for _ in range(5)]
    rows[at] = bad
    return rows


# (name, make file in dir -> path, extra args, expected message parts; "{path}" is the file)
CASES = [
    ("missing-file", lambda d: d / "missing.jsonl", RL, ["{path}: file not found"]),
    (
        "unreadable-parquet",
        lambda d: (d / "x.parquet").write_bytes(b"PAR1 garbage") and d / "x.parquet",
        RL,
        ["{path}: not a readable parquet file"],
    ),
    ("truncated-parquet", lambda d: truncated(d / "t.parquet"), RL, ["{path}: not a readable parquet file"]),
    (
        "missing-column",
        lambda d: parquet(d / "c.parquet", [{"question": "q", "label": "1"}]),
        RL,
        ["{path}: missing key 'prompt': no such column"],
    ),
    (
        "missing-key-in-row",
        lambda d: jsonl(d / "k.jsonl", [{"prompt": "a", "label": "1"}, {"prompt": "b"}]),
        RL,
        ["{path}: row 1 (line 2): missing key 'label'"],
    ),
    (
        "wrong-column-type",
        lambda d: parquet(d / "w.parquet", [{"prompt": 3, "label": "1"}]),
        RL,
        ["{path}: wrong column type: 'prompt' is int64"],
    ),
    (
        "unknown-role",
        lambda d: jsonl(d / "r.jsonl", sft_rows({"messages": [{"role": "robot", "content": "x"}, GOOD[1]]})),
        SFT,
        ["{path}: row 2 (line 3): message 0: unknown role 'robot'"],
    ),
    (
        "no-assistant-turn",
        lambda d: jsonl(d / "n.jsonl", sft_rows({"messages": GOOD[:1]})),
        SFT,
        ["{path}: row 2 (line 3): no assistant turn"],
    ),
    (
        "empty-content",
        lambda d: jsonl(
            d / "e.jsonl", sft_rows({"messages": [GOOD[0], {"role": "assistant", "content": ""}]})
        ),
        SFT,
        ["{path}: row 2 (line 3): message 1 (assistant): empty content"],
    ),
    (
        "malformed-json",
        lambda d: jsonl(d / "j.jsonl", [{"messages": GOOD}, "{oops"]),
        SFT,
        ["{path}: row 1 (line 2): not valid JSON"],
    ),
]


class Dataloader:
    def __init__(self, tmp_path: Path, model_dir: Path, args: list[str]):
        self.process = ServiceProcess(
            "dataloader", ["--hf-checkpoint", str(model_dir), *args], tmp_path / "logs"
        )

    def __enter__(self):
        self.process.start()
        self.channel = open_channel(self.process.address)
        self.stub = dataloader_pb2_grpc.DataloaderServiceStub(self.channel)
        return self

    def __exit__(self, *exc):
        self.channel.close()
        assert self.process.stop() == 0  # drained cleanly: nothing crashed it

    def error_of(self, call, request) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            call(request)
        return info.value


@pytest.mark.parametrize(("make", "args", "parts"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_data_is_refused_at_open_with_file_row_and_problem(tmp_path, tiny_model_dir, make, args, parts):
    path = make(tmp_path)
    with Dataloader(tmp_path, tiny_model_dir, ["--prompt-data", str(path), *args]) as dl:
        error = dl.error_of(dl.stub.NextBatch, pb.NextBatchRequest(batch_id=0, batch_size=2))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        for part in parts:
            assert part.format(path=path) in error.details()
        describe = dl.stub.Describe(pb.DescribeRequest())  # the service answers the next call
        assert parts[0].format(path=path) in describe.error and describe.sources[0].path == str(path)
        for call, request in [
            (dl.stub.GetState, pb.GetStateRequest()),
            (dl.stub.NextBatch, pb.NextBatchRequest(batch_id=1, batch_size=2)),
        ]:
            assert dl.error_of(call, request).code() == grpc.StatusCode.FAILED_PRECONDITION
    assert parts[0].format(path=path) in dl.process.log_text()  # and the log says why at startup


def test_missing_model_directory_is_reported(tmp_path, tiny_model_dir):
    path = jsonl(tmp_path / "d.jsonl", [{"input": "q"}])
    process = ServiceProcess(
        "dataloader",
        ["--hf-checkpoint", str(tmp_path / "no-model"), "--prompt-data", str(path)],
        tmp_path / "logs",
    )
    with process:
        stub = dataloader_pb2_grpc.DataloaderServiceStub(open_channel(process.address))
        with pytest.raises(grpc.RpcError) as info:
            stub.NextBatch(pb.NextBatchRequest(batch_id=0, batch_size=1))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"hf_checkpoint: {tmp_path / 'no-model'} is not a directory" in info.value.details()


def test_a_row_the_tokenizer_rejects_fails_its_batch_and_the_service_keeps_answering(
    tmp_path, tiny_model_dir
):
    template = tmp_path / "picky.jinja"
    template.write_text(PICKY_TEMPLATE)
    rows = sft_rows({"messages": [GOOD[0], {"role": "assistant", "content": "FORBIDDEN"}]}, at=3)
    path = jsonl(tmp_path / "d.jsonl", rows)
    with Dataloader(
        tmp_path,
        tiny_model_dir,
        ["--prompt-data", str(path), "--chat-template-path", str(template), *SFT, "--prefetch-size", "0"],
    ) as dl:
        assert [
            i.row_index for i in dl.stub.NextBatch(pb.NextBatchRequest(batch_id=0, batch_size=3)).items
        ] == [0, 1, 2]
        for _ in range(2):  # the same error again: the bad row is not consumed, batch 1 is still next
            error = dl.error_of(dl.stub.NextBatch, pb.NextBatchRequest(batch_id=1, batch_size=2))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"{path}: row 3: rejected by the chat template or tokenizer" in error.details()
            assert "FORBIDDEN is not allowed" in error.details()
        state = json.loads(dl.stub.GetState(pb.GetStateRequest()).state_json)
        assert state["cursor"] == {"epoch": 0, "offset": 3} and state["counters"]["items_served"] == 3
        assert dl.stub.Describe(pb.DescribeRequest()).error == ""


def test_skip_bad_rows_skips_and_counts_every_kind(tmp_path, tiny_model_dir):
    template = tmp_path / "picky.jinja"
    template.write_text(PICKY_TEMPLATE)
    rows = [
        {"messages": GOOD},
        {"messages": [{"role": "robot", "content": "x"}, GOOD[1]]},  # unknown role
        {"messages": GOOD[:1]},  # no assistant turn
        {"messages": [GOOD[0], {"role": "assistant", "content": " "}]},  # empty content
        "{not json",
        {"conversation": GOOD},  # missing key
        {"messages": [GOOD[0], {"role": "assistant", "content": "FORBIDDEN"}]},  # rejected by the template
        {"messages": GOOD},
        {"messages": "just a string"},  # wrong type for SFT
    ]
    path = jsonl(tmp_path / "d.jsonl", rows)
    args = [
        "--prompt-data",
        str(path),
        "--chat-template-path",
        str(template),
        *SFT,
        "--skip-bad-rows",
        "--num-epoch",
        "2",
    ]
    with Dataloader(tmp_path, tiny_model_dir, args) as dl:
        response = dl.stub.NextBatch(pb.NextBatchRequest(batch_id=0, batch_size=10))
        assert sorted(i.row_index for i in response.items) == [0, 0, 7, 7] and response.exhausted
        counters = dict(response.counters)
        assert counters["bad_rows_at_open"] == 6
        assert counters["rejected_by_tokenizer"] == 2  # drawn once per epoch
        assert counters["skipped_bad_rows"] == 8 and counters["items_served"] == 4
        source = dl.stub.Describe(pb.DescribeRequest()).sources[0]
        assert (source.num_rows, source.num_usable_rows, source.num_bad_rows) == (9, 3, 6)
    assert "skipped bad row" in dl.process.log_text()


def test_configuration_errors_refuse_to_start_naming_the_setting(tmp_path, tiny_model_dir):
    process = ServiceProcess(
        "dataloader",
        ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", "a", "x.jsonl", "b"],
        tmp_path / "logs",
    )
    with pytest.raises(
        RuntimeError, match=r"exited with 2[\s\S]*prompt_data: expects one path or name path pairs"
    ):
        process.start()
