"""Dataset rows: what a row must hold, checked once when a dataset is opened.

A raw row (a dict read from parquet or jsonl) becomes a `Row`: the input under --input-key
(a prompt string, or OpenAI-style messages), the label, the metadata and the tools. Anything
else raises RowProblem with a message meant for the user; the caller adds the file and row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class RowProblem(ValueError):
    """A row cannot be used; the message says why (without the file and row, which callers add)."""


@dataclass(frozen=True)
class RowRules:
    """Which columns hold what, and what the mode requires of them."""

    input_key: str = "input"
    label_key: str = ""
    metadata_key: str = "metadata"
    tool_key: str = ""
    sft: bool = False
    apply_chat_template: bool = False

    def columns(self) -> list[str]:
        """Columns a row is read from."""
        keys = [self.input_key, self.label_key, self.metadata_key, self.tool_key]
        return list(dict.fromkeys(k for k in keys if k))


@dataclass
class Row:
    """A checked row: `input` is a prompt string or a list of message dicts."""

    row_index: int
    input: str | list[dict[str, Any]]
    label: str = ""
    metadata: dict[str, Any] | None = None
    tools: list[Any] | None = None

    def to_json(self) -> bytes:
        record = {"r": self.row_index, "i": self.input, "l": self.label, "m": self.metadata, "t": self.tools}
        return json.dumps(record, ensure_ascii=False, default=str).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Row:
        record = json.loads(data)
        return cls(record["r"], record["i"], record["l"], record["m"], record["t"])


def check_row(raw: Mapping[str, Any], row_index: int, rules: RowRules) -> Row:
    """Turn a raw row into a Row, or raise RowProblem naming the key and the problem."""
    return Row(
        row_index=row_index,
        input=_input(raw, rules),
        label=_label(raw, rules.label_key),
        metadata=_metadata(raw.get(rules.metadata_key), rules.metadata_key),
        tools=_tools(raw.get(rules.tool_key), rules.tool_key) if rules.tool_key else None,
    )


def _input(raw: Mapping[str, Any], rules: RowRules) -> str | list[dict[str, Any]]:
    key = rules.input_key
    if key not in raw:
        raise RowProblem(
            f"missing key {key!r} (the row has {', '.join(map(repr, sorted(raw))) or 'no keys'})"
        )
    value = raw[key]
    if value is None:
        raise RowProblem(f"{key!r} is null")
    if isinstance(value, str):
        if rules.sft:
            raise RowProblem(f"{key!r} is a string; SFT needs a list of messages (role, content)")
        if not value.strip():
            raise RowProblem(f"{key!r} is an empty prompt")
        return value
    if isinstance(value, list | tuple):
        messages = check_messages(value, rules.sft)
        if not rules.apply_chat_template:
            raise RowProblem(f"{key!r} holds messages; rendering them needs --apply-chat-template")
        return messages
    raise RowProblem(
        f"wrong type: {key!r} must be a string or a list of messages (got {type(value).__name__})"
    )


def check_messages(messages: list | tuple, sft: bool) -> list[dict[str, Any]]:
    """OpenAI-style messages: known roles, string content, not empty; SFT needs an assistant turn."""
    if not messages:
        raise RowProblem("the conversation has no messages")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RowProblem(
                f"message {i} is a {type(message).__name__}, not a mapping with role and content"
            )
        # Parquet structs give None for fields a message lacks; templates expect them absent.
        message = {k: v for k, v in message.items() if v is not None}
        role = message.get("role")
        if role not in ROLES:
            raise RowProblem(f"message {i}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
        content = message.get("content")
        calls_tools = role == "assistant" and bool(message.get("tool_calls"))
        if content is not None and not isinstance(content, str):
            raise RowProblem(f"message {i} ({role}): content must be a string (got {type(content).__name__})")
        if not (content or "").strip() and not calls_tools:
            raise RowProblem(f"message {i} ({role}): empty content")
        checked.append(message)
    if sft and not any(m["role"] == "assistant" for m in checked):
        raise RowProblem("no assistant turn: SFT trains on assistant turns")
    return checked


def _label(raw: Mapping[str, Any], key: str) -> str:
    if not key:
        return ""
    if key not in raw:
        raise RowProblem(f"missing key {key!r} (the label; the row has {', '.join(map(repr, sorted(raw)))})")
    value = raw[key]
    if value is None:
        raise RowProblem(f"label {key!r} is null")
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _metadata(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RowProblem(f"wrong type: metadata {key!r} is a string that is not a JSON object") from None
    if not isinstance(value, Mapping):
        raise RowProblem(f"wrong type: metadata {key!r} must be a mapping (got {type(value).__name__})")
    return dict(value)


def _tools(value: Any, key: str) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RowProblem(f"wrong type: tools {key!r} is a string that is not a JSON list") from None
    if not isinstance(value, list | tuple) or not all(isinstance(t, Mapping) for t in value):
        raise RowProblem(f"wrong type: tools {key!r} must be a list of tool definitions (mappings)")
    return list(value)
