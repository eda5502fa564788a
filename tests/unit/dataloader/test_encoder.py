"""Tokenisation and SFT loss masks, checked token for token against apply_chat_template."""

import shutil
from pathlib import Path

import pytest

from rollway.dataloader.encoder import Encoder, TokenizerError, load_tokenizer
from rollway.dataloader.loss_mask import mask_from_offsets
from rollway.dataloader.rows import Row, RowProblem

QWEN_TEMPLATE = Path(__file__).resolve().parents[2] / "data" / "chat_templates" / "qwen_chatml.jinja"
SYSTEM = {"role": "system", "content": "You are a careful math tutor."}
TURNS = [
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "The answer is 42."},
    {"role": "user", "content": "And 7 plus 8?"},
    {"role": "assistant", "content": "15, because 7 + 8 = 15.\nDone."},
]
TOOL_CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 7, "b": 8}}}
TOOL_TURNS = [
    {"role": "user", "content": "Add 7 and 8 with the tool."},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "content": "15"},
    {"role": "assistant", "content": "The sum is 15."},
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "description": "a + b", "parameters": {"type": "object"}},
    }
]


def masked_segments(tokenizer, ids, mask):
    """Decoded runs of consecutive masked tokens."""
    segments, current = [], []
    for token, bit in zip(ids, mask, strict=True):
        if bit:
            current.append(token)
        elif current:
            segments.append(tokenizer.decode(current))
            current = []
    return segments + ([tokenizer.decode(current)] if current else [])


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def qwen_tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir), str(QWEN_TEMPLATE))


@pytest.mark.parametrize("messages", [TURNS, [SYSTEM, *TURNS]], ids=["no-system", "system"])
def test_tiny_template_masks_equal_the_generation_block_masks(tiny_tokenizer, messages):
    encoder = Encoder(tiny_tokenizer, sft=True, apply_chat_template=True)
    assert encoder.generation_blocks
    reference = tiny_tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    encoded = encoder.encode(Row(0, messages))
    assert encoded.token_ids == reference["input_ids"]
    assert encoded.loss_mask == reference["assistant_masks"]
    # The prefix-diff path (used for templates without {% generation %}) finds the same tokens.
    encoder.generation_blocks = False
    by_prefixes = encoder.encode(Row(0, messages))
    assert by_prefixes.token_ids == reference["input_ids"]
    assert by_prefixes.loss_mask == reference["assistant_masks"]


@pytest.mark.parametrize(
    ("messages", "tools", "expected"),
    [
        ([SYSTEM, *TURNS], None, ["The answer is 42.<|im_end|>", "15, because 7 + 8 = 15.\nDone.<|im_end|>"]),
        (TURNS, None, ["The answer is 42.<|im_end|>", "15, because 7 + 8 = 15.\nDone.<|im_end|>"]),
        (
            [SYSTEM, *TOOL_TURNS],
            TOOLS,
            [
                '<tool_call>\n{"name": "add", "arguments": {"a": 7, "b": 8}}\n</tool_call><|im_end|>',
                "The sum is 15.<|im_end|>",
            ],
        ),
    ],
    ids=["system", "default-system", "tools"],
)
def test_qwen_chatml_masks_cover_exactly_the_assistant_turns(qwen_tokenizer, messages, tools, expected):
    encoder = Encoder(qwen_tokenizer, sft=True, apply_chat_template=True)
    assert not encoder.generation_blocks
    encoded = encoder.encode(Row(0, messages, tools=tools))
    reference = qwen_tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)
    assert encoded.token_ids == reference["input_ids"]
    assert masked_segments(qwen_tokenizer, encoded.token_ids, encoded.loss_mask) == expected
    text = qwen_tokenizer.decode(encoded.token_ids)
    system = SYSTEM["content"] if messages[0] is SYSTEM else "You are Qwen, created by Alibaba Cloud."
    assert text.startswith("<|im_start|>system\n" + system)


def test_rl_prompt_is_the_chat_template_with_the_generation_prompt(qwen_tokenizer):
    encoder = Encoder(qwen_tokenizer, sft=False, apply_chat_template=True)
    encoded = encoder.encode(Row(0, "What is 2 + 2?"))
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    assert (
        encoded.prompt_ids
        == qwen_tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    )
    assert encoded.prompt_text.endswith("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    assert encoded.token_ids == [] and encoded.loss_mask == []


def test_rl_prompt_without_chat_template_is_tokenised_as_is(tiny_tokenizer):
    encoded = Encoder(tiny_tokenizer, sft=False, apply_chat_template=False).encode(Row(0, "What is 2 + 2?"))
    assert encoded.prompt_ids == tiny_tokenizer("What is 2 + 2?", add_special_tokens=False)["input_ids"]
    assert encoded.prompt_text == "What is 2 + 2?"


def test_template_that_rewrites_history_is_refused(tiny_tokenizer):
    tokenizer = load_tokenizer(tiny_tokenizer.name_or_path)
    # Drops every assistant turn but the last, like templates that strip earlier reasoning.
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
        "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    with pytest.raises(RowProblem, match="prefix by prefix"):
        Encoder(tokenizer, sft=True, apply_chat_template=True).encode(Row(0, TURNS))


def test_template_errors_are_row_problems(tiny_tokenizer):
    tokenizer = load_tokenizer(tiny_tokenizer.name_or_path)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('tool turns are not supported') }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    )
    with pytest.raises(
        RowProblem, match="rejected by the chat template or tokenizer: .*tool turns are not supported"
    ):
        Encoder(tokenizer, sft=True, apply_chat_template=True).encode(Row(0, TOOL_TURNS))


def test_mask_from_offsets_marks_overlapping_tokens():
    offsets = [(0, 3), (3, 5), (5, 9), (9, 10), (10, 10), (10, 14), (14, 15)]
    assert mask_from_offsets(offsets, [(5, 10)]) == [0, 0, 1, 1, 0, 0, 0]
    assert mask_from_offsets(offsets, [(4, 6), (12, 15)]) == [0, 1, 1, 0, 0, 1, 1]
    assert mask_from_offsets(offsets, [(9, 14)]) == [0, 0, 0, 1, 1, 1, 0]  # zero-width token inside
    assert mask_from_offsets(offsets, []) == [0] * 7


def test_a_tokenizer_without_chat_template_is_refused_for_chat(tmp_path, tiny_model_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    tokenizer = load_tokenizer(str(tmp_path))
    with pytest.raises(TokenizerError, match="no usable chat template"):
        Encoder(tokenizer, sft=False, apply_chat_template=True)
    with pytest.raises(TokenizerError, match="not a directory"):
        load_tokenizer(str(tmp_path / "nope"))
