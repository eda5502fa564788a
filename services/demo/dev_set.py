"""The demo's stopping rule for SFT: greedy exact-match accuracy on a dev split.

The dev split is the first DEV_ROWS prompts of rl.parquet (the GRPO prompts): disjoint from the
SFT conversations and from the held-out eval split that docs/demo.md reports, so stopping SFT on it
leaves the reported accuracy honest. Greedy, at most 8 new tokens and "last number equals the
sum", as the coordinator's eval (temperature 0, exact_match) scores eval.parquet.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq

DEV_ROWS = 200
MAX_NEW_TOKENS = 8  # grpo_config's rollout_max_response_len
NUMBER = re.compile(r"\d+")


def dev_accuracy(model_dir: Path, rl_parquet: Path, rows: int = DEV_ROWS) -> float:
    """Greedy accuracy of the HF model in `model_dir` on the first `rows` prompts of `rl_parquet`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    table = pq.read_table(rl_parquet, columns=["prompt", "label"]).slice(0, rows).to_pylist()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    correct = 0
    with torch.no_grad():
        for row in table:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False
            )
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
            response = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            numbers = NUMBER.findall(response)
            correct += bool(numbers) and numbers[-1] == row["label"]
    return correct / len(table)
