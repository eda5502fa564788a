"""A tiny model that calls the calculator: the tiny model fitted, in a few seconds, to one
conversation (question -> <tool_call> -> tool result -> answer), so that greedy decoding of the
question makes a real tool call and then answers. Nothing else about it is meaningful."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollway.rollout.environments.tool_calls import format_tool_call

QUESTION = "What is 2 + 3?"
ANSWER = "5"
CALL = format_tool_call("calculator", {"expression": "2 + 3"})


def make_tool_calling_model(tiny_model_dir: Path, out_dir: Path, steps: int = 150) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    # The text the rollout service builds for the agent's requests, turn by turn.
    parts = [
        (tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                       add_generation_prompt=True), 0),
        (CALL + "<|im_end|>", 1),
        ("\n" + tokenizer.apply_chat_template([{"role": "tool", "content": ANSWER}], tokenize=False,
                                              add_generation_prompt=True), 0),
        (ANSWER + "<|im_end|>", 1),
    ]  # fmt: skip
    ids, mask = [], []
    for text, trained in parts:
        part = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += part
        mask += [trained] * len(part)
    input_ids = torch.tensor([ids])
    labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask, strict=True)]])
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out_dir = Path(out_dir)
    shutil.copytree(tiny_model_dir, out_dir, dirs_exist_ok=True)
    model.save_pretrained(out_dir)
    return out_dir
