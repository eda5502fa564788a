"""One TRL run for bench_vs_trl.py, executed with the TRL virtualenv's Python (no rollway imports).

    python trl_runner.py sft|grpo --model DIR --data PARQUET --steps N --out FILE.json [--precision P]

Times every optimizer step with a TrainerCallback (on_step_begin -> on_step_end; GRPO's
generation happens inside the step) and writes the per-step seconds and the whole-process time.
"""

from __future__ import annotations

import argparse
import json
import time

STARTED = time.perf_counter()

import torch  # noqa: E402
from datasets import load_dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402


class StepTimer(TrainerCallback):
    def __init__(self):
        self.step_seconds: list[float] = []
        self._start = 0.0
        self.first_step_at = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()
        if not self.first_step_at:
            self.first_step_at = self._start - STARTED

    def on_step_end(self, args, state, control, **kwargs):
        self.step_seconds.append(time.perf_counter() - self._start)


def common_args(args) -> dict:
    # fp32 without gradient checkpointing: the precision and recomputation rollway uses on CPU
    # (TRL's defaults, bf16 autocast and checkpointing, are run with --precision trl-default).
    default = args.precision == "trl-default"
    extra = {} if default else {"bf16": False, "gradient_checkpointing": False}
    return dict(
        output_dir=args.workdir,
        max_steps=args.steps,
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        use_cpu=True,
        **extra,
    )


def run_sft(args, timer: StepTimer) -> dict:
    from trl import SFTConfig, SFTTrainer

    dataset = load_dataset("parquet", data_files=args.data, split="train")
    config = SFTConfig(
        per_device_train_batch_size=64,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        max_length=1024,
        **common_args(args),
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[timer]
    )
    trainer.train()
    return {}


def run_grpo(args, timer: StepTimer) -> dict:
    from trl import GRPOConfig, GRPOTrainer

    dataset = load_dataset("parquet", data_files=args.data, split="train")
    dataset = dataset.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})

    def exact_match(completions, label, **kwargs):
        return [
            float(c[0]["content"].strip() == str(want).strip())
            for c, want in zip(completions, label, strict=True)
        ]

    config = GRPOConfig(
        per_device_train_batch_size=128,  # 16 prompts x 8 samples: one optimizer step per rollout
        num_generations=8,
        max_completion_length=8,
        temperature=1.0,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type="grpo",
        **common_args(args),
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact_match,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    return {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["sft", "grpo"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", choices=["fp32", "trl-default"], default="fp32")
    args = parser.parse_args()
    timer = StepTimer()
    (run_sft if args.workload == "sft" else run_grpo)(args, timer)
    result = {
        "step_seconds": timer.step_seconds,
        "first_step_after_s": timer.first_step_at,
        "process_seconds": time.perf_counter() - STARTED,
        "num_threads": torch.get_num_threads(),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
