"""The real SGLang server's rows of bench_rollout: generation and weight updates, on the CPU route.

A server launched by the `sglang` engine itself (SGLangEngine over deploy/sglang-cpu's 0.5.23
install, OMP_NUM_THREADS=1, fp32), driven through the engine's own calls:

    generate                 the same samples as the hf engine rows (engine.submit)
    update_from_disk         /update_weights_from_disk of the model's own safetensors directory
    update_from_distributed  a gloo weight group between this process (rank 0) and the server;
                             the session, one flattened bucket per <= 512 MiB, end of session:
                             the engine's calls of a real update (rollout/weight_sync/sglang.py)

    idle                     the cores the started server's processes keep busy while it serves
                             nothing, over IDLE_SECONDS (the CPU route's --sleep-on-idle: ~0.02;
                             without it ~1.0, a whole core taken from the trainer beside it)

Weight updates are timed UPDATES times each; the median is reported, with seconds per MB.
"""

from __future__ import annotations

import os
import queue
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UPDATES = 5
IDLE_SECONDS = 10.0
BUCKET_BYTES = 512 * 1024 * 1024


def available() -> str | None:
    """The SGLang release installed for the CPU route, or None."""
    from rollway.rollout.engines.sglang_cpu import DEFAULT_VENV, installed_version

    return installed_version(REPO / DEFAULT_VENV)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_engine(model_dir: Path, log_dir: Path):
    from rollway.rollout.config import RolloutConfig
    from rollway.rollout.engines.sglang import SGLangEngine
    from rollway.rollout.engines.sglang_cpu import DEFAULT_VENV, cpu_settings

    settings = cpu_settings(REPO / DEFAULT_VENV)
    settings["sglang_extra_args"] = [a if a != "128" else "256" for a in settings["sglang_extra_args"]]
    config = RolloutConfig(hf_checkpoint=str(model_dir), dtype="float32", sglang_port=_free_port(),
                           sglang_log_dir=str(log_dir), sglang_startup_timeout=300.0, **settings)  # fmt: skip
    engine = SGLangEngine(config)
    engine.start()
    return engine


def _descendants_cpu_seconds() -> float:
    """User + system CPU seconds of this process's descendants now running (the server's)."""
    parent, ticks = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited while we looked
            parent[int(entry)], ticks[int(entry)] = int(fields[1]), int(fields[11]) + int(fields[12])
    mine = {os.getpid()}
    for _ in range(16):  # the guard, the server, its scheduler and detokenizer: a few levels deep
        mine |= {pid for pid, ppid in parent.items() if ppid in mine}
    return sum(ticks[pid] for pid in mine - {os.getpid()}) / os.sysconf("SC_CLK_TCK")


def idle_cores() -> float:
    """The cores the server keeps busy while it serves nothing."""
    start = _descendants_cpu_seconds()
    time.sleep(IDLE_SECONDS)
    return (_descendants_cpu_seconds() - start) / IDLE_SECONDS


def generate(engine, requests) -> tuple[int, float, float]:
    """(response tokens, seconds to the first finished sample, total seconds)."""
    results: queue.Queue = queue.Queue()
    start = time.perf_counter()
    engine.submit(requests, results.put)
    first, num_tokens = None, 0
    for _ in requests:
        result = results.get(timeout=600)
        assert not result.error, result.error
        first = first if first is not None else time.perf_counter() - start
        num_tokens += len(result.token_ids)
    return num_tokens, first, time.perf_counter() - start


def _buckets(model_dir: Path):
    import torch
    from safetensors.torch import load_file

    from rollway.common.weight_sync.buckets import TensorEntry, bucket_views, dtype_name, plan_buckets

    tensors = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(path))
    specs = [TensorEntry(n, dtype_name(t.dtype), tuple(t.shape)) for n, t in sorted(tensors.items())]
    filled = []
    for bucket in plan_buckets(specs, BUCKET_BYTES):
        buffer = torch.empty(bucket.padded_size, dtype=torch.uint8)
        for name, view in bucket_views(buffer, bucket):
            view.copy_(tensors[name])
        filled.append((bucket, buffer))
    return filled, sum(t.numel() * t.element_size() for t in tensors.values())


def weight_updates(engine, model_dir: Path) -> list[dict]:
    """Rows: seconds (median of UPDATES) and seconds per MB of a disk and a distributed update."""
    from rollway.common.v1 import common_pb2
    from rollway.common.weight_sync.group import GroupSpec, WeightGroup

    buckets, num_bytes = _buckets(model_dir)
    megabytes = num_bytes / 1e6
    disk = []
    for version in range(1, UPDATES + 1):
        start = time.perf_counter()
        engine.update_weights_from_disk(str(model_dir), version)
        disk.append(time.perf_counter() - start)
    spec_pb = common_pb2.WeightGroupSpec(group_name="bench-sglang", master_address="127.0.0.1",
                                         master_port=_free_port(), world_size=2, backend="gloo",
                                         timeout_seconds=120)  # fmt: skip
    joined = threading.Thread(target=engine.init_weights_update_group,
                              args=("127.0.0.1", spec_pb.master_port, 1, 2, spec_pb.group_name, "gloo"))  # fmt: skip
    joined.start()
    group = WeightGroup(GroupSpec.from_proto(spec_pb), 0)
    joined.join()
    distributed = []
    for version in range(UPDATES + 1, 2 * UPDATES + 1):
        start = time.perf_counter()
        receiver = threading.Thread(target=_receive, args=(engine, buckets, spec_pb.group_name, version))
        receiver.start()
        for _, buffer in buckets:
            group.wait(group.broadcast(buffer, src=0))
        receiver.join()
        distributed.append(time.perf_counter() - start)
    group.destroy()
    return [
        {"variant": f"sglang_update_from_{name}", "megabytes": round(megabytes, 2), "num_buckets": len(buckets),
         "update_s": round(statistics.median(times), 4),
         "update_s_per_mb": round(statistics.median(times) / megabytes, 5)}
        for name, times in (("disk", disk), ("distributed", distributed))
    ]  # fmt: skip


def _receive(engine, buckets, group_name: str, version: int) -> None:
    engine.begin_weight_update(group_name)
    try:
        for bucket, _ in buckets:
            engine.update_weights_from_distributed(
                [e.name for e in bucket.entries], [e.dtype for e in bucket.entries],
                [list(e.shape) for e in bucket.entries], group_name, version, load_format="flattened_bucket",
            )  # fmt: skip
    finally:
        engine.end_weight_update(version)


def rows(model_dir: Path, requests, num_samples: int) -> list[dict]:
    """The generation row and the two weight-update rows of one model."""
    with tempfile.TemporaryDirectory() as logs:
        engine = start_engine(model_dir, Path(logs))
        try:
            idle = idle_cores()
            num_tokens, first, total = generate(engine, requests)
            update_rows = weight_updates(engine, model_dir)
        finally:
            engine.stop()
    generation = {
        "variant": "sglang",
        "num_samples": num_samples,
        "output_tokens": num_tokens,
        "output_tokens_per_s": round(num_tokens / total, 1),
        "samples_per_s": round(num_samples / total, 2),
        "time_to_first_sample_s": round(first, 3),
        "total_s": round(total, 2),
    }
    return [generation, {"variant": "sglang_idle", "idle_cores": round(idle, 3)}, *update_rows]
