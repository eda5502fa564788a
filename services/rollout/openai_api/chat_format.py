"""OpenAI chat messages in and out: what a request's messages are, and a model turn as a reply.

A request's messages are normalised (content parts joined, tool calls read from their JSON) so
that the history an agent sends back can be compared with the one recorded, whatever client
wrote it (the `openai` package's models dumped, or plain dicts). A model turn becomes an
assistant message: its <tool_call> blocks (the project's tool-call parser) become OpenAI
`tool_calls`, the rest is the content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rollway.rollout.environments.tool_calls import TOOL_CALL, parse_tool_calls


class BadRequest(ValueError):
    """A request the endpoint refuses (HTTP 400), with a message naming what is wrong."""


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts can be rendered
        parts = []
        for i, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise BadRequest(f"{where}.content[{i}]: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"{where}.content must be a string or a list of text parts")


def _tool_calls(calls: Any, where: str) -> list[dict]:
    out = []
    for i, call in enumerate(calls or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"{where}.tool_calls[{i}] needs function.name")
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            raise BadRequest(f"{where}.tool_calls[{i}].function.arguments is not JSON") from None
        out.append({"id": call.get("id", ""), "name": function["name"], "arguments": arguments})
    return out


def normalise_messages(messages: Any) -> list[dict]:
    """The request's messages as {role, content, tool_calls?, tool_call_id?, name?} dicts."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"{where} needs a string role")
        item = {"role": message["role"], "content": _text(message.get("content"), where)}
        if message.get("tool_calls"):
            item["tool_calls"] = _tool_calls(message["tool_calls"], where)
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                item[key] = message[key]
        out.append(item)
    return out


def same_turn(sent: dict, recorded: dict) -> bool:
    """An agent's copy of a message equals the recorded one (ids of tool calls may be rewritten)."""
    strip = lambda m: (  # noqa: E731
        m["role"],
        m["content"].strip(),
        [(c["name"], c["arguments"]) for c in m.get("tool_calls", [])],
    )
    return strip(sent) == strip(recorded)


def template_messages(messages: list[dict]) -> list[dict]:
    """Normalised messages as chat templates read them (tool call arguments as objects)."""
    out = []
    for m in messages:
        item = {k: v for k, v in m.items() if k != "tool_calls"}
        if m.get("tool_calls"):
            item["tool_calls"] = [
                {
                    "type": "function",
                    "id": c["id"],
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in m["tool_calls"]
            ]
        out.append(item)
    return out


@dataclass(frozen=True)
class AssistantReply:
    """A model turn as an OpenAI assistant message."""

    content: str | None
    tool_calls: list[dict]  # OpenAI form: {"id", "type": "function", "function": {"name", "arguments"}}
    finish_reason: str  # "stop", "length" or "tool_calls"

    def message(self) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message

    def recorded(self) -> dict:
        """The reply as normalise_messages reads it back."""
        return normalise_messages([self.message()])[0]


def assistant_reply(text: str, finish_reason: str, parser: str, call_id_prefix: str) -> AssistantReply:
    """Tool calls out of the model's text (all or none: a malformed call leaves the text as it is)."""
    calls = parse_tool_calls(text, parser)
    if not calls or any(c.error for c in calls):
        return AssistantReply(text, [], finish_reason)
    content = TOOL_CALL.sub("", text).strip() or None
    tool_calls = [
        {
            "id": f"{call_id_prefix}-{i}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for i, c in enumerate(calls)
    ]
    return AssistantReply(content, tool_calls, "tool_calls" if finish_reason == "stop" else finish_reason)
