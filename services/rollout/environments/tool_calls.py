"""Tool calls in the model's text, in the chat template's format.

Qwen3 (and Qwen2.5, Miles' `--generate-tool-call-parser qwen25`) write each call as

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "1234 + 567"}}
    </tool_call>

A call whose JSON is malformed is returned as a ToolCall with `error` set, so the environment can
answer the model with the error instead of failing the episode.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # why the call could not be read (then name and arguments are empty)


def _read_call(body: str) -> ToolCall:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"tool call is not valid JSON: {exc.msg} at position {exc.pos}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall("", error='tool call must be a JSON object with a string "name"')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some templates write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(call["name"], error='"arguments" is a string that is not JSON')
    if not isinstance(arguments, dict):
        return ToolCall(call["name"], error='"arguments" must be a JSON object')
    return ToolCall(call["name"], arguments)


def parse_tool_calls(text: str, parser: str = "qwen3") -> list[ToolCall]:
    """The tool calls in `text`, in order (an unterminated last call is read to the end)."""
    if parser not in ("qwen3", "qwen25"):
        raise ValueError(f"unknown tool call parser {parser!r}; known: qwen3, qwen25")
    return [_read_call(m.group(1).strip()) for m in TOOL_CALL.finditer(text)]


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as the model should write it (used to build SFT conversations)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
