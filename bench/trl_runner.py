"""One TRL run for bench_vs_trl.py, executed with the TRL virtualenv's Python (no rollway imports).

    python trl_runner.py sft|grpo --model DIR --data PARQUET --steps N --out FILE.json [--precision P]
        [--batch-size B --lr LR --num-generations G --max-completion-length L --reward R]

Times every optimizer step with a TrainerCallback (on_step_begin -> on_step_end; GRPO's
generation happens inside the step) and writes the per-step seconds, the whole-process time and
the process's peak resident memory. The batch flags default to the tiny model's workload of
bench_vs_trl.py (WORKLOADS below); bench_vs_trl_smollm2.py passes the real model's.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import time

STARTED = time.perf_counter()

import torch  # noqa: E402
from datasets import load_dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402

# Per workload, the defaults of the batch flags: bench_vs_trl.py's tiny-model workloads (issue #18).
WORKLOADS = {
    "sft": {"batch_size": 64, "lr": 3e-3},
    "grpo": {"batch_size": 128, "lr": 1e-4, "num_generations": 8, "max_completion_length": 8},
}
NUMBER = re.compile(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?")


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
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
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

    def last_number(completions, label, **kwargs):
        # rollway's exact_match on a numeric label (rollway/rollout/rewards/text_match.py, without
        # \boxed{}): the response's last number equals the label. The same reward teaches both
        # models the same short answers, so their completion lengths (and step times) stay alike.
        def final(text: str) -> float | None:
            numbers = NUMBER.findall(text)
            return float(numbers[-1].replace(",", "")) if numbers else None

        return [
            float(final(c[0]["content"]) == float(want)) for c, want in zip(completions, label, strict=True)
        ]

    config = GRPOConfig(
        # prompts x generations in one batch: one optimizer step per rollout, like rollway's
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type="grpo",
        **common_args(args),
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=last_number if args.reward == "last-number" else exact_match,
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
    parser.add_argument("--batch-size", type=int, help="samples per optimizer step")
    parser.add_argument("--lr", type=float)
    parser.add_argument("--num-generations", type=int, help="GRPO: samples per prompt")
    parser.add_argument("--max-completion-length", type=int, help="GRPO: new tokens at most")
    parser.add_argument(
        "--reward",
        choices=["exact", "last-number"],
        default="exact",
        help="GRPO: the response's text or last number",
    )
    args = parser.parse_args()
    for name, default in WORKLOADS[args.workload].items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    timer = StepTimer()
    (run_sft if args.workload == "sft" else run_grpo)(args, timer)
    result = {
        "step_seconds": timer.step_seconds,
        "first_step_after_s": timer.first_step_at,
        "process_seconds": time.perf_counter() - STARTED,
        "num_threads": torch.get_num_threads(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: kB
    }
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
