"""Rollout generation throughput: the hf engine's continuous vs static batching vs `model.generate`.

Workload: P prompts x n samples, sampled at temperature 1 with a set of stop tokens (the EOS
ids plus a few more), so response lengths vary the way RL responses do; more samples than
`max_running_requests` fit in one batch. Every variant runs the same prompts, stop set and
limits, in process, on one CPU thread:

    continuous            HFEngine, --hf-batching continuous (samples join as others finish)
    static                HFEngine, --hf-batching static (next batch once the whole batch is done)
    hf_generate           model.generate on padded batches of max_running_requests prompts
    transformers_cb       model.generate_batch (transformers' own continuous batching), tiny only
    sglang                a real SGLang server (the `sglang` engine on the CPU route, where
                          `make sglang-cpu` installed it), and its weight-update times per MB
                          from disk and over a gloo group (bench/sglang_server_bench.py)

Figures: output_tokens_per_s (response tokens, up to and including the stop token, over wall
time), time_to_first_sample_s (first finished sample; for batch-at-once variants the first batch),
total_s. The engine also computes the fp32 log-probs of every token; model.generate does not.
"""

from __future__ import annotations

import queue
import tempfile
import time
from pathlib import Path

import torch

from bench import sglang_server_bench
from bench.harness import BenchResult

SEED = 0
EXTRA_STOP_TOKENS = tuple(range(300, 308))


def _workload(num_prompts: int, n: int) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(SEED)
    prompts = []
    for _ in range(num_prompts):
        length = int(torch.randint(8, 40, (1,), generator=gen))
        prompts.append((1, *torch.randint(3, 300, (length,), generator=gen).tolist()))
    return [p for p in prompts for _ in range(n)]


def _requests(samples, max_new: int):
    from rollway.rollout.engines.base import SampleRequest
    from rollway.rollout.sampling import SamplingParams

    stop = frozenset(EXTRA_STOP_TOKENS)
    return [
        SampleRequest(
            i, prompt, SamplingParams(max_new_tokens=max_new, stop_token_ids=stop, seed=i), prompt_key=i
        )
        for i, prompt in enumerate(samples)
    ]


def _engine_variant(model_dir: Path, batching: str, samples, max_running: int, max_new: int) -> dict:
    from rollway.rollout.config import RolloutConfig
    from rollway.rollout.engines.hf import HFEngine

    config = RolloutConfig(
        hf_checkpoint=str(model_dir), hf_batching=batching, max_running_requests=max_running
    )
    engine = HFEngine(config)
    engine.start()
    requests = _requests(samples, max_new)
    results: queue.Queue = queue.Queue()
    start = time.perf_counter()
    engine.submit(requests, results.put)
    first = None
    num_tokens = 0
    for _ in requests:
        result = results.get()
        first = first if first is not None else time.perf_counter() - start
        num_tokens += len(result.token_ids)
    total = time.perf_counter() - start
    engine.stop()
    return _row(batching, num_tokens, first, total, len(samples))


def _stop_ids(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    from rollway.rollout.engines.hf_weights import eos_token_ids

    return sorted(
        eos_token_ids(str(model_dir), AutoTokenizer.from_pretrained(model_dir)) | set(EXTRA_STOP_TOKENS)
    )


def _response_tokens(row: list[int], stop: set[int]) -> int:
    for i, token in enumerate(row):
        if token in stop:
            return i + 1
    return len(row)


def _generate_variant(model_dir: Path, samples, max_running: int, max_new: int) -> dict:
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    stop = _stop_ids(model_dir)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new,
                              eos_token_id=stop, pad_token_id=0)  # fmt: skip
    torch.manual_seed(SEED)
    start = time.perf_counter()
    first, num_tokens = None, 0
    for begin in range(0, len(samples), max_running):
        batch = samples[begin : begin + max_running]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, generation_config=config)
        first = first if first is not None else time.perf_counter() - start
        num_tokens += sum(_response_tokens(row, set(stop)) for row in out[:, width:].tolist())
    return _row("hf_generate", num_tokens, first, time.perf_counter() - start, len(samples))


def _transformers_cb_variant(model_dir: Path, samples, max_new: int) -> dict:
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    stop = _stop_ids(model_dir)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new,
                              eos_token_id=stop, pad_token_id=0)  # fmt: skip
    start = time.perf_counter()
    out = model.generate_batch(
        [list(p) for p in samples], generation_config=config,
        continuous_batching_config=ContinuousBatchingConfig(return_logprobs=True),
    )  # fmt: skip
    total = time.perf_counter() - start
    num_tokens = sum(len(o.generated_tokens) for o in out.values())
    return _row("transformers_cb", num_tokens, None, total, len(samples))


def _row(variant: str, num_tokens: int, first: float | None, total: float, num_samples: int) -> dict:
    return {
        "variant": variant,
        "num_samples": num_samples,
        "output_tokens": num_tokens,
        "output_tokens_per_s": round(num_tokens / total, 1),
        "samples_per_s": round(num_samples / total, 2),
        "time_to_first_sample_s": round(first, 3) if first is not None else None,
        "total_s": round(total, 2),
    }


def run(quick: bool) -> BenchResult:
    from rollway.demo.tiny_model import count_parameters, make_tiny_model

    torch.set_num_threads(1)
    # (preset, prompts, samples per prompt, max running, max new tokens)
    plans = [("tiny", 16, 4, 16, 128)] if quick else [("tiny", 64, 4, 64, 256), ("small", 24, 4, 32, 128)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset, num_prompts, n, max_running, max_new in plans:
            model_dir = make_tiny_model(Path(tmp) / preset, seed=SEED, preset=preset)
            from transformers import AutoModelForCausalLM

            num_params = count_parameters(AutoModelForCausalLM.from_pretrained(model_dir))
            samples = _workload(num_prompts, n)
            variants = [
                _engine_variant(model_dir, "continuous", samples, max_running, max_new),
                _engine_variant(model_dir, "static", samples, max_running, max_new),
                _generate_variant(model_dir, samples, max_running, max_new),
            ]
            if preset == "tiny" and not quick:
                variants.append(_transformers_cb_variant(model_dir, samples, max_new))
            if sglang_server_bench.available():
                variants += sglang_server_bench.rows(model_dir, _requests(samples, max_new), len(samples))
            for row in variants:
                rows.append({"model": preset, "params_m": round(num_params / 1e6, 1), "max_running": max_running,
                             "max_new_tokens": max_new, **row})  # fmt: skip
    return BenchResult(
        name="rollout",
        rows=rows,
        units={
            "output_tokens_per_s": "tokens/s",
            "time_to_first_sample_s": "s",
            "total_s": "s",
            "params_m": "M",
            "samples_per_s": "samples/s",
            "update_s": "s",
            "update_s_per_mb": "s/MB",
            "idle_cores": "cores",
        },  # fmt: skip
        config={
            "threads": 1,
            "temperature": 1.0,
            "extra_stop_tokens": len(EXTRA_STOP_TOKENS),
            "seed": SEED,
            "sglang": sglang_server_bench.available() or "not installed (make sglang-cpu)",
        },  # fmt: skip
        notes="hf engine continuous vs static batching vs model.generate vs a real SGLang server; "
        "same prompts and stop set; SGLang also: weight-update seconds per MB (disk, distributed) and the cores an idle server keeps busy",
    )
