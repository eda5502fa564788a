"""CPU seconds of one trainer step on demo-like batches: a steady figure on a busy machine.

    PYTHONPATH=.pp python -m bench.trainer_step_cpu [--preset small] [--steps 8] [--cpu-threads N]

One gloo rank, the engine exactly as the service builds it (default settings: packed rows by token
budget, prefix sharing; threads: --cpu-threads, 0 being the trainer's default, the usable cores).
Batches like the demo's: GRPO, 16 rl.parquet prompts x 8 responses of 1-7 digits + <|im_end|>;
SFT, 64 sft.parquet conversations. Prints, per workload,
the medians of CPU time (time.process_time: what the step computes, whatever else runs on the
machine), wall time and the perf/* breakdown. Run it on two checkouts to compare them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

import pyarrow.parquet as pq
import torch.distributed as dist
from transformers import AutoTokenizer

from rollway.common.config import from_dict, to_dict
from rollway.demo.data import make_demo_data
from rollway.demo.tiny_model import make_tiny_model
from rollway.trainer.config import TrainerConfig
from rollway.trainer.distributed import init_process_group
from rollway.trainer.engine import TrainerEngine
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.train_plan import plan_train_steps


def _ids(encoded) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def demo_batches(tok, data: dict, seed: int = 0) -> dict[str, list[SequenceItem]]:
    rng = random.Random(seed)
    sft = []
    for row in pq.read_table(data["sft"]).to_pylist()[:64]:
        full = _ids(tok.apply_chat_template(row["messages"], tokenize=True))
        prompt = _ids(tok.apply_chat_template(row["messages"][:1], tokenize=True, add_generation_prompt=True))
        sft.append(SequenceItem(len(sft), full, len(prompt), [1] * (len(full) - len(prompt))))
    grpo = []
    digits = tok.convert_tokens_to_ids(list("0123456789"))
    for row in pq.read_table(data["rl"]).to_pylist()[:16]:
        message = [{"role": "user", "content": row["prompt"]}]
        prompt = _ids(tok.apply_chat_template(message, tokenize=True, add_generation_prompt=True))
        for _ in range(8):
            response = [rng.choice(digits) for _ in range(rng.randint(1, 7))] + [tok.eos_token_id]
            advantages = {"advantages": [rng.uniform(-1, 1)] * len(response)}
            grpo.append(
                SequenceItem(len(grpo), prompt + response, len(prompt), [1] * len(response), advantages)
            )
    return {"grpo": grpo, "sft": sft}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--cpu-threads",
        type=int,
        default=0,
        help="the trainer's cpu_threads (0: its default, the usable cores)",
    )
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="trainer-step-cpu-")
    model = make_tiny_model(os.path.join(tmp, "model"), seed=0, preset=args.preset)
    data = make_demo_data(os.path.join(tmp, "data"), seed=0)
    batches = demo_batches(AutoTokenizer.from_pretrained(model), data)
    info = init_process_group(dist.FileStore(os.path.join(tmp, "store"), 1), 0, 1, 600.0)
    for name, loss_type in (("grpo", "policy_loss"), ("sft", "sft_loss")):
        items = batches[name]
        config = from_dict(
            TrainerConfig,
            {
                "hf_checkpoint": str(model),
                "dtype": "float32",
                "loss_type": loss_type,
                "cpu_threads": args.cpu_threads,
            },
        )
        engine = TrainerEngine(config, info)
        engine.init(to_dict(config))
        engine.train(plan_train_steps(items, config, 1)[0][0])  # warm-up
        cpu, wall, metrics = [], [], []
        for _ in range(args.steps):
            steps = plan_train_steps(items, config, 1)[0][0]
            started, started_cpu = time.perf_counter(), time.process_time()
            metrics.append(engine.train(steps)[0])
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
        breakdown = {
            k.removeprefix("perf/"): round(statistics.median(m[k] for m in metrics), 4)
            for k in metrics[0]
            if k.startswith("perf/")
        }
        print(
            f"{name}: {statistics.median(cpu):.4f} cpu-s/step, {statistics.median(wall):.4f} s/step wall, "
            f"{sum(map(len, items))} sample tokens, {breakdown}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
