"""Demo datasets for the tiny model: two-digit addition ("What is 37 + 45?" -> "82").

`make_demo_data(out_dir)` writes three parquet files (and, on request, the same rows as jsonl):

    sft.parquet   messages: list<struct<role: string, content: string>>
                      [{"role": "user", "content": "What is 37 + 45?"},
                       {"role": "assistant", "content": "82"}]
    rl.parquet    prompt: string     "What is 37 + 45?"   (the user turn; apply the chat template)
                  label: string      "82"                 (the sum, digits only)
                  metadata: struct<a: int64, b: int64>    {"a": 37, "b": 45}
    eval.parquet  same columns as rl.parquet, held out

Operands are 10..99. The three splits use disjoint pairs, and eval also holds out the swapped
pair (37 + 45 held out means 45 + 37 is never trained on), so eval measures generalisation. The
assistant answer is the bare sum: the shortest target, which a ~1M-parameter model learns by SFT
in a few CPU minutes and an exact-match reward can check. Same seed -> byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "MIN_OPERAND",
    "MAX_OPERAND",
    "SFT_SCHEMA",
    "RL_SCHEMA",
    "format_question",
    "format_answer",
    "split_pairs",
    "make_demo_data",
]

MIN_OPERAND = 10
MAX_OPERAND = 99

SFT_SCHEMA = pa.schema(
    [pa.field("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))]
)
RL_SCHEMA = pa.schema(
    [
        pa.field("prompt", pa.string()),
        pa.field("label", pa.string()),
        pa.field("metadata", pa.struct([("a", pa.int64()), ("b", pa.int64())])),
    ]
)

Pair = tuple[int, int]


def format_question(a: int, b: int) -> str:
    """The user turn for a + b: "What is 37 + 45?"."""
    return f"What is {a} + {b}?"


def format_answer(a: int, b: int) -> str:
    """The assistant answer and the RL label for a + b: the sum's digits, "82"."""
    return str(a + b)


def split_pairs(
    seed: int, num_sft: int, num_rl: int, num_eval: int
) -> tuple[list[Pair], list[Pair], list[Pair]]:
    """Disjoint (sft, rl, eval) operand pairs; neither order of an eval pair is in sft or rl."""
    operands = range(MIN_OPERAND, MAX_OPERAND + 1)
    pairs = [(a, b) for a in operands for b in operands]
    random.Random(seed).shuffle(pairs)
    eval_pairs = pairs[:num_eval]
    held_out = {frozenset(pair) for pair in eval_pairs}
    train_pool = [pair for pair in pairs[num_eval:] if frozenset(pair) not in held_out]
    if num_sft + num_rl > len(train_pool):
        raise ValueError(
            f"num_sft + num_rl: {num_sft + num_rl} rows asked, but only {len(train_pool)} "
            f"two-digit pairs remain after holding out {num_eval} eval pairs"
        )
    return train_pool[:num_sft], train_pool[num_sft : num_sft + num_rl], eval_pairs


def _sft_rows(pairs: Sequence[Pair]) -> list[dict]:
    return [
        {
            "messages": [
                {"role": "user", "content": format_question(a, b)},
                {"role": "assistant", "content": format_answer(a, b)},
            ]
        }
        for a, b in pairs
    ]


def _rl_rows(pairs: Sequence[Pair]) -> list[dict]:
    return [
        {"prompt": format_question(a, b), "label": format_answer(a, b), "metadata": {"a": a, "b": b}}
        for a, b in pairs
    ]


def _write(rows: list[dict], schema: pa.Schema, path: Path, jsonl: bool) -> dict[str, Path]:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    written = {path.stem: path}
    if jsonl:
        jsonl_path = path.with_suffix(".jsonl")
        jsonl_path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        written[f"{path.stem}_jsonl"] = jsonl_path
    return written


def make_demo_data(
    out_dir: str | Path,
    seed: int = 0,
    num_sft: int = 2000,
    num_rl: int = 1000,
    num_eval: int = 200,
    jsonl: bool = False,
) -> dict[str, Path]:
    """Write sft.parquet, rl.parquet and eval.parquet (schema in the module docstring) to `out_dir`.

    Returns {"sft": path, "rl": path, "eval": path}, plus "sft_jsonl", "rl_jsonl", "eval_jsonl"
    when `jsonl` is true (one JSON object a line, the same rows). Raises ValueError when the
    splits need more than the 8,100 two-digit pairs allow.
    """
    for name, value in (("num_sft", num_sft), ("num_rl", num_rl), ("num_eval", num_eval)):
        if value < 0:
            raise ValueError(f"{name}: must be >= 0, got {value}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sft_pairs, rl_pairs, eval_pairs = split_pairs(seed, num_sft, num_rl, num_eval)
    paths: dict[str, Path] = {}
    paths |= _write(_sft_rows(sft_pairs), SFT_SCHEMA, out_dir / "sft.parquet", jsonl)
    paths |= _write(_rl_rows(rl_pairs), RL_SCHEMA, out_dir / "rl.parquet", jsonl)
    paths |= _write(_rl_rows(eval_pairs), RL_SCHEMA, out_dir / "eval.parquet", jsonl)
    return paths


def ensure_demo_assets(workdir: Path) -> tuple[Path, Path]:
    """The tiny model's directory and the demo data directory under `workdir` (built if missing):
    what `rollway up` serves."""
    model_dir = workdir / "tiny-model"
    if not (model_dir / "config.json").exists():
        # Imported only to build it: torch and transformers cost seconds that `rollway up` over a
        # model already in place (every run after the first) need not pay.
        from rollway.demo.tiny_model import make_tiny_model

        make_tiny_model(model_dir, seed=0)
    make_demo_data(workdir / "data", seed=0)
    return model_dir, workdir / "data"


def main(argv: list[str] | None = None) -> None:
    """`python -m rollway.demo.data OUT_DIR [--seed N] [--jsonl]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-sft", type=int, default=2000)
    parser.add_argument("--num-rl", type=int, default=1000)
    parser.add_argument("--num-eval", type=int, default=200)
    parser.add_argument("--jsonl", action="store_true", help="also write the rows as .jsonl")
    args = parser.parse_args(argv)
    paths = make_demo_data(args.out_dir, args.seed, args.num_sft, args.num_rl, args.num_eval, args.jsonl)
    for path in paths.values():
        print(path)


if __name__ == "__main__":
    main()


# A reward that varies between the tiny model's samples. exact_match scores an untrained model 0
# everywhere, so GRPO would compute no gradient; runs that must change the weights (tests of
# recovery, soak benchmarks, client tests) use this one through custom_rm_path.
DIGIT_SHARE_REWARD = '''
def digit_share(sample):
    """Share of digits among a response's non-space characters: varies between samples."""
    text = "".join(sample.response.split())
    return sum(c.isdigit() for c in text) / max(len(text), 1)
'''


def write_digit_share_reward(directory: Path, module: str = "digit_reward") -> str:
    """Write DIGIT_SHARE_REWARD as DIRECTORY/MODULE.py (put DIRECTORY on the rollout service's
    PYTHONPATH); returns the custom_rm_path that names it."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / f"{module}.py").write_text(DIGIT_SHARE_REWARD)
    return f"{module}:digit_share"


def addition_grpo_task(data_dir: Path, seed: int) -> dict:
    """The settings every GRPO demo on the addition data shares (the tiny model's and SmolLM2's):
    the task, its reward and its held-out set; each demo adds its model, sizes and schedule."""
    return {
        "loss_type": "policy_loss",
        "advantage_estimator": "grpo",
        "prompt_data": [str(data_dir / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_shuffle": True,
        "rollout_seed": seed,
        "seed": seed,
        "eval_prompt_data": ["add", str(data_dir / "eval.parquet")],
        "rollout_temperature": 1.0,
        "rm_type": "exact_match",
        "use_dynamic_batch_size": True,
    }
