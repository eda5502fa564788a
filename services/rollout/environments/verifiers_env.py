"""--environment verifiers: episodes of a `verifiers` taskset (PyPI verifiers==0.4.0) on rollway's engine.

verifiers 0.4.0 (`verifiers.v1`) describes an environment as a Taskset of Tasks. A Task carries its
data (prompt, system prompt, answer, ...), its tool servers (`Task.toolsets`: vf.Toolset objects
whose @vf.tool methods are served over MCP) and its judgement (@vf.reward with weights, @vf.metric).
verifiers' own runner launches a harness program (a chat loop that uv installs) that calls the
model through an interception server. Here rollway's engine is the model and its episode engine
is the loop, so that the trainer sees exactly the sampled tokens; verifiers' code does the rest:

    export_prompts    the tasks' prompts (system prompt, prompt, tool schemas) as a JSONL dataset
    reset             the episode's Task (metadata vf_task_idx, checked against the label = its key),
                      its toolsets set up (setup, setup_task) and registered on in-process MCP
                      servers (Toolset.register), read back through an MCP client
    step              the model's turn -> a vf AssistantMessage (tool calls read by the project's
                      parser, --generate-tool-call-parser) committed to a vf Trace (graph.prepare_turn,
                      commit); its tool calls -> MCP call_tool -> tool messages (Step.messages,
                      rendered by the served model's chat template); a turn without tool calls ends
                      the episode: Task.score(trace) -> reward = trace.reward (weighted sum),
                      metrics = each reward's score and each metric (rollout/env/<name>)

verifiers is async: its coroutines run on one event loop thread this module owns, each call with
a deadline (--environment-step-timeout). Unsupported here: harness programs, @vf.stop conditions,
toolsets with their own State (verifiers syncs it over an HTTP channel of its runner), judges that
need a runtime. An episode cut by a limit (max_turns, length, ...) is not scored: reward 0.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from rollway.common.config import ConfigError, load_object
from rollway.rollout.environments.base import Environment, EnvironmentFailed, EpisodeStart, ModelTurn, Step
from rollway.rollout.environments.tool_calls import TOOL_CALL, parse_tool_calls

TASK_INDEX_KEY = "vf_task_idx"  # the metadata key naming a prompt's task


def load_taskset(path: str, setting: str = "verifiers_taskset"):
    """The vf.Taskset that `module:attr` names: a Taskset, a vf.Env (its taskset) or a zero-argument
    callable returning either (a `load_environment`-style function)."""
    import verifiers.v1 as vf

    found = load_object(path, setting)
    if callable(found) and not isinstance(found, vf.Taskset | vf.Env) and not isinstance(found, type):
        try:
            found = found()
        except Exception as exc:
            raise ConfigError(setting, f"{path}() failed: {type(exc).__name__}: {exc}") from None
    if isinstance(found, vf.Env):
        found = found.taskset
    if not isinstance(found, vf.Taskset):
        raise ConfigError(setting, f"{path} is a {type(found).__name__}, not a verifiers Taskset or Env")
    if not found.bounded:
        raise ConfigError(setting, f"{path} yields tasks forever; bound it (taskset.take(n))")
    return found


def prompt_messages(task) -> list:
    """The conversation a task opens with, as vf messages (the system prompt first)."""
    import verifiers.v1 as vf

    data = task.data
    messages = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append(vf.UserMessage(content=data.prompt))
    elif data.prompt:
        messages.extend(data.prompt)
    return messages


def _wire(message) -> dict[str, Any]:
    return message.model_dump(mode="json", exclude_none=True)


class VerifiersEnvironments:
    """One loaded taskset, its tool schemas and the event loop; `new_episode` is the factory."""

    def __init__(self, taskset_path: str, tool_call_parser: str, timeout_seconds: float):
        self.taskset = load_taskset(taskset_path)
        self.tasks = {task.data.idx: task for task in self.taskset}
        self.parser = tool_call_parser
        self.timeout_seconds = timeout_seconds
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="verifiers-loop", daemon=True).start()

    def run(self, coroutine: Coroutine) -> Any:
        """Run a coroutine on the loop and wait for it (EnvironmentFailed after the deadline)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(self.timeout_seconds)
        except TimeoutError:
            future.cancel()
            raise EnvironmentFailed(f"verifiers call took longer than {self.timeout_seconds:g} s") from None

    def task(self, start: EpisodeStart):
        idx = start.metadata.get(TASK_INDEX_KEY)
        if not isinstance(idx, int | float) or int(idx) not in self.tasks:
            raise EnvironmentFailed(
                f"metadata {TASK_INDEX_KEY}={idx!r} names no task of the taskset ({len(self.tasks)} tasks); "
                "export the prompts with export_prompts"
            )
        task = self.tasks[int(idx)]
        if start.label and start.label != task.key:
            raise EnvironmentFailed(
                f"task {int(idx)} has key {task.key}, the prompt's label is {start.label}: the prompts "
                "were exported from another version of the taskset"
            )
        return task

    def new_episode(self) -> VerifiersEnvironment:
        return VerifiersEnvironment(self)


async def _tool_servers(task) -> dict[str, Any]:
    """The task's toolsets on in-process MCP servers, by tool name (verifiers' register)."""
    from mcp.client.client import Client
    from mcp.server.mcpserver import MCPServer

    servers: dict[str, Any] = {}
    for toolset in type(task).toolsets(task.config):
        await toolset.setup()
        await toolset.setup_task(task)
        server = MCPServer(toolset.server_name or type(toolset).__name__)
        toolset.register(server)
        async with Client(server) as client:
            listed = await client.list_tools()
        for tool in listed.tools:
            if tool.name in servers:
                raise ValueError(f"two toolsets offer a tool named {tool.name!r}")
            servers[tool.name] = (server, tool)
    return servers


def tool_schemas(task) -> list[dict[str, Any]]:
    """The task's tools as OpenAI function schemas (what the chat template renders)."""
    servers = asyncio.run(_tool_servers(task))
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": tool.description or "",
                "parameters": tool.input_schema,
            },
        }
        for name, (_, tool) in servers.items()
    ]


async def _call_tool(server, name: str, arguments: dict[str, Any]) -> str:
    from mcp.client.client import Client

    async with Client(server) as client:
        result = await client.call_tool(name, arguments)
    return "\n".join(part.text for part in result.content if getattr(part, "text", None) is not None)


class VerifiersEnvironment(Environment):
    """One episode of one verifiers Task (see the module doc)."""

    def __init__(self, pool: VerifiersEnvironments):
        self.pool = pool

    def reset(self, start: EpisodeStart) -> None:
        import verifiers.v1 as vf

        self.task = self.pool.task(start)
        self.servers = self.pool.run(_tool_servers(self.task))
        self.tools = [
            vf.Tool(name=name, description=tool.description or "", parameters=tool.input_schema)
            for name, (_, tool) in self.servers.items()
        ]
        self.messages = prompt_messages(self.task)
        self.trace = vf.Trace(
            task=vf.TraceTask(type=type(self.task).__name__, data=self.task.data, key=self.task.key),
            agent=vf.AgentInfo(config=vf.AgentConfig(model="rollway")),
        )
        self.num_turns = 0

    def step(self, turn: ModelTurn) -> Step:
        import verifiers.v1 as vf
        from verifiers.v1.graph import prepare_turn

        self.num_turns += 1
        calls = parse_tool_calls(turn.text, self.pool.parser)
        ids = [f"call_{self.num_turns}_{i}" for i in range(len(calls))]
        message = vf.AssistantMessage(
            content=TOOL_CALL.sub("", turn.text).strip() if calls else turn.text,
            tool_calls=[
                vf.ToolCall(id=i, name=c.name, arguments=json.dumps(c.arguments))
                for i, c in zip(ids, calls, strict=True)
            ]
            or None,
        )
        response = vf.Response(
            id=f"turn_{self.num_turns}",
            created=int(time.time()),
            model="rollway",
            message=message,
            finish_reason="tool_calls" if calls else "stop",
        )
        prepare_turn(self.trace, list(self.messages), self.tools).commit(response)
        self.messages.append(message)
        if not calls:
            return self._score()
        results = []
        for call_id, call in zip(ids, calls, strict=True):
            result = self._run_tool(call)
            self.messages.append(vf.ToolMessage(tool_call_id=call_id, content=result, name=call.name or None))
            results.append({"role": "tool", "content": result})
        return Step(messages=results)

    def _run_tool(self, call) -> str:
        if call.error:
            return f"error: {call.error}"
        if call.name not in self.servers:
            return f"error: unknown tool {call.name!r}; available: {', '.join(self.servers) or 'none'}"
        server, _ = self.servers[call.name]
        return self.pool.run(_call_tool(server, call.name, call.arguments))

    def _score(self) -> Step:
        trace = self.trace
        self.pool.run(self.task.score(trace))
        trace.is_completed = trace.ok = True
        metrics = {name: value for name, value in trace.metrics.items() if value is not None}
        metrics.update({name: r.score for name, r in trace.rewards.items() if r is not None})
        return Step(reward=trace.reward, done=True, metrics=metrics)


def export_prompts(taskset_path: str, out_path: str | Path) -> int:
    """Write the taskset's prompts as JSONL for the dataloader (input_key: messages, label_key:
    label, tool_key: tools, apply_chat_template: true): each row's messages (system prompt included),
    the tools' schemas, label = the task's key and metadata vf_task_idx. Returns the row count."""
    taskset = load_taskset(taskset_path)
    schemas: dict[tuple[type, str], list] = {}  # tool schemas depend on the task class and its config
    rows = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for task in taskset:
            key = (type(task), task.config.model_dump_json())
            if key not in schemas:
                schemas[key] = tool_schemas(task)
            row = {
                "messages": [_wire(m) for m in prompt_messages(task)],
                "label": task.key,
                "metadata": {TASK_INDEX_KEY: task.data.idx},
            }
            if schemas[key]:
                row["tools"] = schemas[key]
            out.write(json.dumps(row) + "\n")
            rows += 1
    return rows
