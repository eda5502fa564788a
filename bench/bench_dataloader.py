"""Dataloader: rows/s of tokenised SFT batches served over gRPC, with and without prefetch, and
peak memory of the service for two dataset sizes (it must not grow with the file).

The dataset is generated: multi-turn conversations (a system prompt on half of them, 1-3
user/assistant turns of 8-40 words) in parquet, rendered with the Qwen ChatML template shipped
with the tests (a template without {% generation %} blocks, so loss masks take the
prefix-render path) and the tiny model's tokenizer. The service shuffles (random access into
its row store). Each configuration is a fresh service process on a loopback port:

- throughput: NextBatch back to back (the client does nothing between calls);
- latency: NextBatch while the client spends `step_ms` per batch elsewhere (a training step),
  which is what prefetch is for: with it, the batch is ready when asked for;
- memory: the service's peak RSS (VmHWM) after opening and serving, for N and 2N rows;
- start_to_serving_s: process start to health SERVING, which includes reading, checking and
  indexing every row of the file.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.harness import BenchResult

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/support: ServiceProcess

QWEN_TEMPLATE = ROOT / "tests" / "data" / "chat_templates" / "qwen_chatml.jinja"
WORDS = (
    "what is the answer sum of and plus minus times compute please think step by reason put your final "
    "number in a box you are helpful tutor explain why because first then so result check again total"
).split()
SCHEMA = pa.schema(
    [pa.field("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))]
)


def write_conversations(path: Path, num_rows: int, seed: int = 0, chunk: int = 20_000) -> Path:
    """num_rows conversations in parquet, written chunk by chunk (row groups of 8192 rows)."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    with pq.ParquetWriter(path, SCHEMA) as writer:
        for start in range(0, num_rows, chunk):
            rows = []
            for _ in range(min(chunk, num_rows - start)):
                messages = (
                    [{"role": "system", "content": "You are a helpful tutor."}] if rng.random() < 0.5 else []
                )
                for _turn in range(int(rng.integers(1, 4))):
                    for role in ("user", "assistant"):
                        text = " ".join(words[rng.integers(0, len(words), int(rng.integers(8, 41)))])
                        messages.append({"role": role, "content": text.capitalize() + "."})
                rows.append({"messages": messages})
            writer.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), row_group_size=8192)
    return path


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(
    model_dir: Path, data: Path, workdir: Path, prefetch: int, batch_size: int, batches: int, step_ms: float
):
    from support.processes import ServiceProcess

    from rollway.common.client import open_channel
    from rollway.dataloader.v1 import dataloader_pb2 as pb
    from rollway.dataloader.v1 import dataloader_pb2_grpc

    args = ["--hf-checkpoint", str(model_dir), "--prompt-data", str(data), "--input-key", "messages",
            "--apply-chat-template", "--chat-template-path", str(QWEN_TEMPLATE), "--mode", "sft",
            "--rollout-shuffle", "--prefetch-size", str(prefetch), "--num-epoch", "0"]  # fmt: skip
    started = time.perf_counter()
    with ServiceProcess("dataloader", args, workdir, env={"TOKENIZERS_PARALLELISM": "false"}) as service:
        open_seconds = time.perf_counter() - started
        stub = dataloader_pb2_grpc.DataloaderServiceStub(open_channel(service.address))
        batch_id = 0

        def next_batch():
            nonlocal batch_id
            batch_id += 1  # batch ids count from 0
            return stub.NextBatch(
                pb.NextBatchRequest(batch_id=batch_id - 1, batch_size=batch_size), timeout=600
            )

        next_batch()  # warm up (first tokenisation, connection); sustained rate from here, no head start
        start, rows, tokens = time.perf_counter(), 0, 0
        for _ in range(batches):
            items = next_batch().items
            rows += len(items)
            tokens += sum(len(item.token_ids) for item in items)
        throughput_seconds = time.perf_counter() - start
        latencies = []
        for _ in range(max(batches // 4, 3)):
            time.sleep(step_ms / 1000)
            t = time.perf_counter()
            next_batch()
            latencies.append((time.perf_counter() - t) * 1000)
        depth = next_batch().prefetch_queue_depth
        rss = peak_rss_mb(service.pid)
    return {
        "rows_per_s": rows / throughput_seconds,
        "tokens_per_s": tokens / throughput_seconds,
        "batch_latency_ms_p50": statistics.median(latencies),
        "prefetch_queue_depth": depth,
        "start_to_serving_s": open_seconds,
        "peak_rss_mb": rss,
    }


def run(quick: bool) -> BenchResult:
    from rollway.demo.tiny_model import make_tiny_model

    small_rows = 20_000 if quick else 200_000
    batch_size, batches, step_ms = 128, (8 if quick else 40), 400.0
    prefetch = 4 * batch_size
    with tempfile.TemporaryDirectory(prefix="bench-dataloader-") as tmp:
        tmp = Path(tmp)
        model_dir = make_tiny_model(tmp / "model", seed=0)
        rows = []
        for num_rows in (small_rows, 2 * small_rows):
            t = time.perf_counter()
            data = write_conversations(tmp / f"conversations-{num_rows}.parquet", num_rows)
            generated_s = time.perf_counter() - t
            for size in [0, prefetch] if num_rows == small_rows else [prefetch]:
                figures = measure(model_dir, data, tmp / "work", size, batch_size, batches, step_ms)
                rows.append({
                    "dataset_rows": num_rows,
                    "file_mb": round(data.stat().st_size / 2**20, 1),
                    "prefetch_size": size,
                    **figures,
                })  # fmt: skip
                print(f"  {rows[-1]} (dataset generated in {generated_s:.1f}s)", flush=True)
    return BenchResult(
        name="dataloader",
        rows=rows,
        units={
            "file_mb": "MiB",
            "rows_per_s": "rows/s",
            "tokens_per_s": "tokens/s",
            "batch_latency_ms_p50": "ms",
            "start_to_serving_s": "s",
            "peak_rss_mb": "MiB",
        },
        config={
            "batch_size": batch_size,
            "batches_timed": batches,
            "simulated_step_ms": step_ms,
            "mode": "sft (loss masks), Qwen ChatML template, tiny-model tokenizer, shuffled",
        },
        notes="SFT conversations over gRPC on loopback; peak RSS must not grow with dataset_rows",
    )
