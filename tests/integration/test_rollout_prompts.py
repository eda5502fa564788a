"""Prompts as text or chat messages on a real rollout service: the same samples as their token
ids, the dataloader's templated ids for messages, response text decoding the response tokens,
and bad prompts refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from support.processes import ServiceProcess
from transformers import AutoTokenizer

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.dataloader.v1 import dataloader_pb2, dataloader_pb2_grpc
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

QWEN_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "chat_templates" / "qwen_chatml.jinja"
BAD = grpc.StatusCode.INVALID_ARGUMENT
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Count to three."},
    ],
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, tmp_path_factory):
    args = ["--hf-checkpoint", str(tiny_model_dir), "--reward", "none"]
    with ServiceProcess("rollout", args, tmp_path_factory.mktemp("rollout")) as svc:
        yield rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))


def _messages(conversation) -> list[rollout_pb2.ChatMessage]:
    return [rollout_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in conversation]


def _generate(stub, prompts, n=1, **sampling) -> list[common_pb2.Sample]:
    request = rollout_pb2.GenerateRequest(
        prompts=prompts, n_samples_per_prompt=n, sampling_params=common_pb2.SamplingParams(**sampling)
    )
    samples = [r.sample for r in stub.Generate(request, timeout=120)]
    return sorted(samples, key=lambda s: s.index)


def _fields(sample: common_pb2.Sample) -> tuple:
    return (
        sample.index,
        list(sample.prompt_token_ids),
        list(sample.response_token_ids),
        list(sample.rollout_log_probs),
        sample.finish_reason,
        sample.response_text,
    )


def test_a_text_prompt_gives_the_samples_of_its_token_ids(rollout, tokenizer):
    text = "Question: what is 12 + 30?\nAnswer:"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    sampling = {"temperature": 1.0, "max_new_tokens": 24, "seed": 7}
    as_text = _generate(rollout, [rollout_pb2.Prompt(text=text)], n=3, **sampling)
    as_ids = _generate(rollout, [rollout_pb2.Prompt(token_ids=ids)], n=3, **sampling)
    assert [_fields(s) for s in as_text] == [_fields(s) for s in as_ids]
    assert all(list(s.prompt_token_ids) == ids for s in as_text)
    assert len({tuple(s.response_token_ids) for s in as_text}) > 1  # really sampled, per-sample seeds
    for sample in as_text:  # the response text is the response tokens decoded
        assert sample.response_text == tokenizer.decode(sample.response_token_ids, skip_special_tokens=True)
        assert sample.response_text


def test_messages_are_rendered_by_the_chat_template_with_the_generation_prompt(rollout, tokenizer):
    prompts = [rollout_pb2.Prompt(messages=_messages(c)) for c in CONVERSATIONS]
    samples = _generate(rollout, prompts, temperature=0.0, max_new_tokens=8)
    for conversation, sample in zip(CONVERSATIONS, samples, strict=True):
        text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n")
        assert list(sample.prompt_token_ids) == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert sample.response_text == tokenizer.decode(sample.response_token_ids, skip_special_tokens=True)
    mixed = _generate(
        rollout,
        [
            rollout_pb2.Prompt(token_ids=samples[0].prompt_token_ids),
            prompts[1],
            rollout_pb2.Prompt(text="Hi"),
        ],
        temperature=0.0,
        max_new_tokens=8,
    )
    for got, want in zip(mixed[:2], samples[:2], strict=True):  # other batch mates: log-probs within noise
        assert (got.prompt_token_ids, got.response_token_ids) == (
            want.prompt_token_ids,
            want.response_token_ids,
        )
        assert list(got.rollout_log_probs) == pytest.approx(list(want.rollout_log_probs), abs=1e-4)


def test_messages_give_the_dataloaders_templated_token_ids(tiny_model_dir, tmp_path):
    # Both services take --chat-template-path (one run-config key) and tokenise the same way.
    data = tmp_path / "chat.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": c, "label": str(i)}) + "\n" for i, c in enumerate(CONVERSATIONS))
    )
    template = ["--chat-template-path", str(QWEN_TEMPLATE)]
    dataloader_args = [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(data),
        "--input-key",
        "prompt",
    ]
    dataloader_args += ["--label-key", "label", "--apply-chat-template", *template]
    rollout_args = ["--hf-checkpoint", str(tiny_model_dir), "--reward", "none", *template]
    with (
        ServiceProcess("dataloader", dataloader_args, tmp_path / "dataloader") as dl,
        ServiceProcess("rollout", rollout_args, tmp_path / "rollout") as ro,
    ):
        loader = dataloader_pb2_grpc.DataloaderServiceStub(open_channel(dl.address))
        items = loader.NextBatch(dataloader_pb2.NextBatchRequest(batch_id=0, batch_size=3), timeout=60).items
        stub = rollout_pb2_grpc.RolloutServiceStub(open_channel(ro.address))
        by_row = {item.row_index: item for item in items}
        assert sorted(by_row) == [0, 1, 2]
        as_messages = _generate(
            stub, [rollout_pb2.Prompt(messages=_messages(c)) for c in CONVERSATIONS], max_new_tokens=4
        )
        as_text = _generate(
            stub, [rollout_pb2.Prompt(text=by_row[i].prompt_text) for i in range(3)], max_new_tokens=4
        )
    for i, (messages_sample, text_sample) in enumerate(zip(as_messages, as_text, strict=True)):
        expected = list(by_row[i].prompt_token_ids)
        assert "You are Qwen" in by_row[i].prompt_text or CONVERSATIONS[i][0]["role"] == "system"
        assert list(messages_sample.prompt_token_ids) == expected
        assert list(text_sample.prompt_token_ids) == expected


LONG_TEXT = " ".join(f"w{i}" for i in range(2000))  # far more than the 1024-token context


@pytest.mark.parametrize(
    "prompts,code,field",
    [
        ([rollout_pb2.Prompt(token_ids=[1, 2], text="hi")], BAD, "prompts[0]: give exactly one"),
        (
            [
                rollout_pb2.Prompt(text="a"),
                rollout_pb2.Prompt(text="b", messages=_messages(CONVERSATIONS[0])),
            ],
            BAD,
            "prompts[1]: give exactly one",
        ),
        ([rollout_pb2.Prompt(text="")], BAD, "prompts[0].text"),
        ([rollout_pb2.Prompt()], BAD, "prompts[0].token_ids"),
        (
            [
                rollout_pb2.Prompt(token_ids=[1]),
                rollout_pb2.Prompt(messages=[rollout_pb2.ChatMessage(role="user", content="a")] * 3),
                rollout_pb2.Prompt(text="x"),
                rollout_pb2.Prompt(
                    messages=[
                        rollout_pb2.ChatMessage(role="user", content="a"),
                        rollout_pb2.ChatMessage(content="b"),
                    ]
                ),
            ],
            BAD,
            "prompts[3].messages[1].role",
        ),
        ([rollout_pb2.Prompt(text=LONG_TEXT)], BAD, "prompts[0].text"),
    ],
)
def test_bad_prompts_are_refused_naming_the_field(rollout, prompts, code, field):
    with pytest.raises(grpc.RpcError) as info:
        _generate(rollout, prompts, max_new_tokens=4)
    assert info.value.code() == code and info.value.details().startswith(field), info.value.details()
    assert len(_generate(rollout, [rollout_pb2.Prompt(text="still serving")], max_new_tokens=2)) == 1
