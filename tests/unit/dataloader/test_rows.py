"""Row checks: prompts, OpenAI-style messages, labels, metadata, tools."""

import pytest

from rollway.dataloader.rows import Row, RowProblem, RowRules, check_row

RL = RowRules(input_key="prompt", label_key="label", apply_chat_template=True)
SFT = RowRules(input_key="messages", sft=True, apply_chat_template=True)
CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_rl_prompt_row_with_label_and_metadata():
    row = check_row({"prompt": "What is 1 + 2?", "label": "3", "metadata": {"a": 1, "b": 2}}, 7, RL)
    assert row == Row(7, "What is 1 + 2?", "3", {"a": 1, "b": 2}, None)


def test_labels_that_are_not_strings_become_json_text():
    assert check_row({"prompt": "p", "label": 82}, 0, RL).label == "82"
    assert check_row({"prompt": "p", "label": [1, 2]}, 0, RL).label == "[1, 2]"


def test_metadata_as_json_string_absent_or_null():
    assert check_row({"prompt": "p", "label": "", "metadata": '{"k": [1]}'}, 0, RL).metadata == {"k": [1]}
    assert check_row({"prompt": "p", "label": ""}, 0, RL).metadata == {}
    assert check_row({"prompt": "p", "label": "", "metadata": None}, 0, RL).metadata == {}


def test_messages_drop_null_fields_and_allow_tool_turns():
    messages = [
        {"role": "system", "content": "be brief", "tool_calls": None},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": {}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    row = check_row({"messages": messages}, 3, SFT)
    assert row.input[0] == {"role": "system", "content": "be brief"}
    assert len(row.input) == 5


def test_row_round_trips_through_its_json_record():
    row = Row(5, CHAT, "lbl", {"x": 1.5}, [{"type": "function"}])
    assert Row.from_json(row.to_json()) == row


@pytest.mark.parametrize(
    ("raw", "rules", "problem"),
    [
        ({"other": "x"}, RL, "missing key 'prompt'"),
        ({"prompt": None, "label": ""}, RL, "'prompt' is null"),
        ({"prompt": "  ", "label": ""}, RL, "empty prompt"),
        (
            {"prompt": 5, "label": ""},
            RL,
            "wrong type: 'prompt' must be a string or a list of messages (got int)",
        ),
        ({"prompt": "p"}, RL, "missing key 'label'"),
        ({"prompt": "p", "label": None}, RL, "label 'label' is null"),
        ({"prompt": "p", "label": "", "metadata": [1]}, RL, "metadata 'metadata' must be a mapping"),
        ({"prompt": "p", "label": "", "metadata": "not json"}, RL, "not a JSON object"),
        ({"messages": "hi"}, SFT, "SFT needs a list of messages"),
        ({"messages": []}, SFT, "no messages"),
        ({"messages": ["hi"]}, SFT, "message 0 is a str"),
        ({"messages": [{"role": "robot", "content": "x"}]}, SFT, "message 0: unknown role 'robot'"),
        ({"messages": [{"role": "user", "content": ""}, CHAT[1]]}, SFT, "message 0 (user): empty content"),
        ({"messages": [{"role": "user", "content": 3}, CHAT[1]]}, SFT, "content must be a string"),
        ({"messages": [{"role": "user", "content": "x"}]}, SFT, "no assistant turn"),
        ({"messages": CHAT}, RowRules(input_key="messages"), "needs --apply-chat-template"),
    ],
)
def test_bad_rows_raise_the_problem(raw, rules, problem):
    with pytest.raises(RowProblem) as info:
        check_row(raw, 0, rules)
    assert problem in str(info.value)
