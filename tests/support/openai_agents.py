"""Agents for the tests of the OpenAI-compatible endpoint, written against the real `openai` client.
They run inside the rollout service; what they saw goes to the JSON file named by the sample's
metadata["record"], for the test to compare with the sample."""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
from openai import AsyncOpenAI, OpenAI

from rollway.demo.openai_agent import TOOLS, calculator_agent
from rollway.rollout.environments.calculator import run_calculator


def _write(task, record) -> None:
    Path(task.metadata["record"]).write_text(json.dumps(record))


def _message(completion) -> dict:
    return completion.choices[0].message.model_dump(exclude_none=True)


def recording_calculator_agent(base_url: str, task) -> float:
    """The example's tool loop, asking for log-probs and keeping each response's record."""
    client = OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    turns = []
    for _ in range(3):
        completion = client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, logprobs=True
        )
        choice = completion.choices[0]
        turns.append(
            {
                "rollway": completion.model_extra["rollway"],
                "message": _message(completion),
                "finish_reason": choice.finish_reason,
                "logprobs": [t.logprob for t in choice.logprobs.content],
            }
        )
        messages.append(_message(completion))
        if not choice.message.tool_calls:
            break
        for call in choice.message.tool_calls:
            result = run_calculator(json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    _write(task, turns)
    return float((choice.message.content or "").strip() == task.label)


def streaming_agent(base_url: str, task) -> float:
    """One chat turn, streamed or not (metadata["stream"]): the content and tool calls it got."""
    client = OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    request = dict(model="policy", messages=[{"role": "user", "content": task.prompt}], tools=TOOLS)
    if not task.metadata.get("stream"):
        message = client.chat.completions.create(**request).choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        _write(task, {"content": message.content or "", "tool_calls": calls, "num_chunks": 1})
        return 0.0
    content, calls, num_chunks, finish = "", [], 0, None
    for chunk in client.chat.completions.create(**request, stream=True):
        num_chunks += 1
        delta = chunk.choices[0].delta
        content += delta.content or ""
        calls += [(c.function.name, c.function.arguments) for c in delta.tool_calls or []]
        finish = chunk.choices[0].finish_reason or finish
    _write(task, {"content": content, "tool_calls": calls, "num_chunks": num_chunks, "finish": finish})
    return 0.0


async def marker_agent(base_url: str, task) -> float:
    """Async: two turns about its own marker; its reward is the marker's number (so that a mix-up
    of episodes shows in the rewards)."""
    client = AsyncOpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    marker = task.metadata["marker"]
    messages = [{"role": "user", "content": task.prompt}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages += [_message(first), {"role": "user", "content": f"again {marker}"}]
    await client.chat.completions.create(model="policy", messages=messages)
    return float(marker.removeprefix("marker-"))


def history_rewriting_agent(base_url: str, task) -> float:
    """Rewrites the conversation once (refused), then extends it properly; reward via the API."""
    client = OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    first = client.chat.completions.create(model="policy", messages=messages)
    rewritten = [
        {"role": "user", "content": "something else"},
        _message(first),
        {"role": "user", "content": "go"},
    ]
    record = {}
    try:
        client.chat.completions.create(model="policy", messages=rewritten)
    except openai.BadRequestError as exc:
        record["refused"] = (
            exc.status_code,
            exc.body["message"] if isinstance(exc.body, dict) else str(exc.body),
        )
    messages += [_message(first), {"role": "user", "content": "go"}]
    client.chat.completions.create(model="policy", messages=messages)
    client.post("/reward", body={"reward": 0.25}, cast_to=object)
    _write(task, record)
    return None  # the posted reward counts


def completions_agent(base_url: str, task) -> float:
    """The legacy completions API: a prompt, then the prompt extended by the completion and more."""
    client = OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    first = client.completions.create(model="policy", prompt=task.prompt)
    prompt = task.prompt + first.choices[0].text + " then?"
    second = client.completions.create(model="policy", prompt=prompt)
    _write(task, {"texts": [first.choices[0].text, second.choices[0].text]})
    return 1.0


def failing_agent(base_url: str, task) -> float:
    client = OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}])
    raise RuntimeError("the agent's own bug")


def by_metadata(base_url: str, task) -> float:
    """One service, several agents: metadata["agent"] names the one to run."""
    return globals()[task.metadata["agent"]](base_url, task)


def weight_update_agent(base_url: str, task) -> float:
    """Two turns with a pause between them (until the test's "go" file exists): the test updates the
    weights meanwhile. Records each turn's weight version as the responses gave them."""
    client = OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    first = client.chat.completions.create(model="policy", messages=messages)
    Path(task.metadata["between_turns"]).write_text("")
    go, deadline = Path(task.metadata["go"]), time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.02)
    messages += [_message(first), {"role": "user", "content": "and now?"}]
    second = client.chat.completions.create(model="policy", messages=messages)
    _write(task, [c.model_extra["rollway"]["weight_version"] for c in (first, second)])
    return 1.0


def cut_turn_agent(base_url: str, task) -> float:
    """A turn cut by the per-turn token limit still comes back (finish_reason "length"); the episode
    is then over for the agent."""
    client = OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    first = client.chat.completions.create(model="policy", messages=messages)
    record = {"finish": first.choices[0].finish_reason, "tokens": first.usage.completion_tokens}
    messages += [_message(first), {"role": "user", "content": "more"}]
    try:
        client.chat.completions.create(model="policy", messages=messages)
    except openai.APIStatusError as exc:
        record["next_status"] = exc.status_code
    _write(task, record)
    return 1.0


def auth_agent(base_url: str, task) -> float:
    """With the service's --auth-token: a wrong key is refused (401), the task's key is taken."""
    record = {}
    try:
        OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    except openai.AuthenticationError as exc:
        record["wrong_key_status"] = exc.status_code
    client = OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    record["models"] = [m.id for m in client.models.list()]
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}])
    _write(task, record)
    return 1.0


def scored_calculator_agent(base_url: str, task) -> None:
    """The example's tool loop, leaving the reward to the run's reward function (--reward)."""
    calculator_agent(base_url, task)
