"""An agent written against the official `openai` client: it answers arithmetic questions with the
help of a calculator tool. rollway runs it once per sample (--environment agent
--agent-function-path rollway.demo.openai_agent:calculator_agent) and trains on what it did.

The agent is an ordinary OpenAI tool-use loop; nothing in it is specific to rollway except its
signature: (base_url, task) -> reward, where task has prompt, label, metadata and api_key.
"""

import json

from openai import OpenAI

from rollway.rollout.environments.calculator import run_calculator

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
MAX_MODEL_TURNS = 3


def calculator_agent(base_url: str, task) -> float:
    """Ask the question, run the calculator for every tool call, reward 1.0 for the right answer."""
    client = OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    for _ in range(MAX_MODEL_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:  # the answer
            return float((message.content or "").strip() == task.label.strip())
        for call in message.tool_calls:
            if call.function.name == "calculator":
                result = run_calculator(json.loads(call.function.arguments))
            else:
                result = f"error: unknown tool {call.function.name!r}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0  # no answer within MAX_MODEL_TURNS
