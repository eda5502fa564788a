"""OpenAI messages in and out of agent episodes: normalisation, history comparison, tool calls."""

import json

import pytest

from rollway.rollout.environments.tool_calls import format_tool_call
from rollway.rollout.openai_api.chat_format import (
    BadRequest,
    assistant_reply,
    normalise_messages,
    same_turn,
)


def test_a_model_turn_with_tool_calls_becomes_openai_tool_calls():
    text = "let me see\n" + format_tool_call("calculator", {"expression": "1 + 2"})
    reply = assistant_reply(text, "stop", "qwen3", "call")
    assert reply.finish_reason == "tool_calls" and reply.content == "let me see"
    [call] = reply.tool_calls
    assert call["id"] == "call-0" and call["type"] == "function"
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "1 + 2"}


def test_a_malformed_tool_call_stays_text():
    reply = assistant_reply("<tool_call>{not json</tool_call>", "stop", "qwen3", "call")
    assert reply.tool_calls == [] and reply.content == "<tool_call>{not json</tool_call>"
    assert reply.finish_reason == "stop"


def test_the_agents_copy_of_a_reply_compares_equal_however_it_is_written():
    reply = assistant_reply(format_tool_call("calculator", {"expression": "3"}), "stop", "qwen3", "call")
    # The openai client's model_dump: other call ids, arguments re-serialised, no content.
    sent = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "x",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression":"3"}'},
            }
        ],
    }
    assert same_turn(normalise_messages([sent])[0], reply.recorded())
    other = {**sent, "content": "changed"}
    assert not same_turn(normalise_messages([other])[0], reply.recorded())


def test_content_parts_are_joined():
    [m] = normalise_messages(
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    )
    assert m == {"role": "user", "content": "ab"}


@pytest.mark.parametrize(
    "messages, problem",
    [
        ([], "non-empty list"),
        ([{"content": "x"}], "messages[0] needs a string role"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0]"),
        ([{"role": "assistant", "tool_calls": [{"function": {}}]}], "messages[0].tool_calls[0]"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
            "arguments is not JSON",
        ),
    ],
)
def test_bad_messages_are_refused_naming_the_field(messages, problem):
    with pytest.raises(BadRequest, match=problem.replace("[", r"\[").replace("]", r"\]")):
        normalise_messages(messages)
