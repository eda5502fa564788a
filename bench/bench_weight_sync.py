"""Weight sync bandwidth: a full update vs a raw broadcast of one flat buffer vs the disk path.

What runs: plain processes (spawned), each running the services' own weight-sync code, without
gRPC (in a run the control hop carries only the manifest: a few ms):

    trainer ranks (1 or 2)  default gloo group; a Qwen3 model of the size with random fp32
                            weights, sharded by the trainer's shard_model (FSDP2); rank 0 forms
                            the weight group (rollway.common.weight_sync.group). Every rank runs
                            rollway.trainer.weight_sync.passes.weight_pass with the Checksums, then
                            the Broadcast step: the WeightPass commands as PushWeights runs them
    rollout processes (1|2) rollway.rollout.weight_sync.receiver.WeightReceiver over an engine whose
                            weight hooks are the hf engine's (loadable_tensors, swap_named_tensors):
                            receive into staging, verify every bucket, acknowledge, swap, commit
    the manifest            rank 0 -> each receiver through a multiprocessing queue

Settings are the coordinator's defaults for in-process receivers: float32, 512 MiB buckets
broadcast in 16 MiB pieces, acknowledgements on. Figures:
    seconds / gb_per_s      start of the plan pass on rank 0 -> the last receiver committed, for
                            the third update (the first two allocate the receivers' two staging
                            sets, as the first two updates of a run do); bytes = the weights in
                            the serving dtype
    raw_gb_per_s            the same weight group broadcasting one preallocated flat buffer of the
                            same number of bytes from rank 0 (the better of two rounds)
    ratio_vs_raw_broadcast  gb_per_s / raw_gb_per_s (the target is >= 0.8)
    plan_seconds            the gather + checksum pass before the manifest (not overlapped)
    disk_seconds / disk_gb_per_s   (1 rank, 1 rollout rows) the disk path: write pass (one
                            safetensors file per bucket), fsync, atomic rename, then the receiver
                            reads, verifies and swaps in (files still in the page cache)
On a 2-core machine every process shares the cores with the loopback transport. With 2 trainer
ranks the broadcast pass gathers each bucket onto rank 0 point to point (each rank sends its
shards' byte ranges; rollway.trainer.weight_sync.gather): rank 0 receives half the bytes before it
broadcasts them. With one bucket (10M, 100M) that gather is not overlapped; with several (500M)
the gather of bucket i+1 overlaps the broadcast of bucket i.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from bench.harness import BenchResult
from rollway.coordinator.weight_sync import WeightSyncSettings

BUCKET_BYTES = 512 * 1024 * 1024
UPDATES = 3  # the last is measured: the first two allocate the receivers' two staging sets
CHUNK_BYTES = WeightSyncSettings.broadcast_chunk_bytes  # the coordinator's default for in-process receivers
SIZES = {  # name -> Qwen3 config overrides (vocab 32000, tied embeddings)
    "10M": dict(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),  # noqa: E501
    "100M": dict(
        hidden_size=768,
        intermediate_size=2560,
        num_hidden_layers=10,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
    ),  # noqa: E501
    "500M": dict(
        hidden_size=1536,
        intermediate_size=4608,
        num_hidden_layers=16,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=128,
    ),  # noqa: E501
}
TOPOLOGIES = [(1, 1), (1, 2), (2, 1), (2, 2)]  # (trainer ranks, rollout processes)


PRELOAD = [
    "torch",
    "torch.distributed.fsdp",
    "transformers",
    "rollway.trainer.weight_sync.distributed",
    "rollway.trainer.sharding",
    "rollway.rollout.weight_sync.receiver",
    "bench.bench_weight_sync",
]


def _die_with_parent() -> None:
    """A benchmark process never outlives the benchmark (Linux: SIGKILL when the parent dies)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hf_config(size: str):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=32000, tie_word_embeddings=True, **SIZES[size])


def _meta_model(hf_config):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)


class BenchEngine:
    """The receiver-facing part of the hf engine (its weight hooks) over a bare model."""

    name = "bench"
    receives_weights_in_process = True
    num_workers = 1

    def __init__(self, model):
        self.model = model
        self.weight_version = 0

    def weight_tensors(self):
        from rollway.rollout.engines.hf_weights import loadable_tensors

        return loadable_tensors(self.model)

    def named_parameters(self):
        return self.model.named_parameters()

    def swap_weights(self, named_tensors):
        from rollway.rollout.engines.hf_weights import swap_named_tensors

        return swap_named_tensors(self.model, named_tensors)


def _group_spec(port: int, world_size: int):
    from rollway.common.v1 import common_pb2

    return common_pb2.WeightGroupSpec(group_name="bench", master_address="127.0.0.1", master_port=port,
                                      world_size=world_size, backend="gloo", timeout_seconds=300)  # fmt: skip


def _trainer(rank: int, topology: dict, ports, queues, results, workdir) -> None:
    _die_with_parent()
    import torch

    torch.set_num_threads(1)
    from types import SimpleNamespace

    from rollway.common.manifest import fsync_tree
    from rollway.common.weight_sync.buckets import to_manifest
    from rollway.common.weight_sync.group import GroupSpec, WeightGroup
    from rollway.trainer.config import TrainerConfig
    from rollway.trainer.distributed import create_store, init_process_group
    from rollway.trainer.weight_sync.base import Checksums
    from rollway.trainer.weight_sync.disk import WriteFiles
    from rollway.trainer.weight_sync.distributed import Broadcast, DistributedSender
    from rollway.trainer.weight_sync.passes import weight_pass

    num_ranks, with_disk = topology["trainer_ranks"], topology["with_disk"]
    config = TrainerConfig(hf_checkpoint="bench", dtype="float32", world_size=num_ranks)
    info = init_process_group(
        create_store(rank, num_ranks, "127.0.0.1", ports["trainer"], 300), rank, num_ranks, 300
    )
    hf_config = _hf_config(topology["size"])
    engine = SimpleNamespace(model=_sharded_model(hf_config, config, info), info=info, hf_config=hf_config)
    phase = dict(dtype="float32", bucket_size_bytes=BUCKET_BYTES)
    if rank != 0:  # the gathers of the updates and of the disk write, in rank 0's order
        for _ in range(UPDATES):
            weight_pass(engine, **phase, step=Checksums())
            weight_pass(engine, **phase, step=Broadcast(False, 0))
        if with_disk:
            weight_pass(engine, **phase, step=WriteFiles(""))
        return
    group = WeightGroup(
        GroupSpec.from_proto(_group_spec(ports["weights"], 1 + topology["rollout_services"])), 0
    )
    sender = DistributedSender(group)
    row = {"raw_seconds": _raw(group, sum(p.numel() * 4 for p in engine.model.parameters()))}
    for version in range(1, UPDATES + 1):
        group.exchange_status(0)  # start together
        row["started"] = time.monotonic()
        plan = weight_pass(engine, **phase, step=Checksums())
        manifest = to_manifest(plan.buckets, version, "distributed", broadcast_chunk_bytes=CHUNK_BYTES)
        for q in queues:
            q.put(manifest.SerializeToString())
        sent = weight_pass(engine, **phase, step=Broadcast(True, CHUNK_BYTES, sender))
        assert not sent.error and set(sent.receiver_status) == {0}, (sent.error, sent.receiver_status)
    row.update(num_bytes=sent.num_bytes, num_buckets=len(plan.buckets), plan_seconds=plan.gather_seconds
               + plan.checksum_seconds, send_seconds=sent.wire_seconds)  # fmt: skip
    if with_disk:
        group.exchange_status(0)
        row["disk_started"] = time.monotonic()
        tmp, final = Path(workdir, ".weights.tmp"), Path(workdir, f"weights-v{UPDATES + 1:08d}")
        tmp.mkdir()
        written = weight_pass(engine, **phase, step=WriteFiles(str(tmp)))
        fsync_tree(tmp)
        os.replace(tmp, final)
        for q in queues:
            q.put(to_manifest(written.buckets, UPDATES + 1, "disk", str(final)).SerializeToString())
    results.put(("trainer", row))
    group.exchange_status(0)  # wait until the receivers are done before tearing down
    group.destroy()


def _sharded_model(hf_config, config, info):
    """The trainer's FSDP2 sharding (shard_model) of a model with random weights from rank 0."""
    import torch

    from rollway.trainer.model_loading import LoadedModel
    from rollway.trainer.sharding import shard_model

    loaded = LoadedModel(model=_meta_model(hf_config), hf_config=hf_config)
    if info.rank == 0:
        source = _meta_model(hf_config).to_empty(device="cpu")
        with torch.no_grad():
            for p in source.parameters():
                p.uniform_(-0.05, 0.05)
        loaded.full_state_dict = source.state_dict()
        loaded.buffers = {n: torch.ones_like(b) for n, b in source.named_buffers()}
    return shard_model(loaded, config, info)


def _raw(group, num_bytes: int) -> float:
    """Best of two broadcasts of one preallocated flat buffer of `num_bytes` from rank 0."""
    import torch

    buffer = torch.ones(num_bytes, dtype=torch.uint8)
    best = float("inf")
    for _ in range(2):
        group.exchange_status(0)
        started = time.monotonic()
        group.broadcast(buffer).wait()
        group.exchange_status(0)  # every receiver has the whole buffer
        best = min(best, time.monotonic() - started)
    return best


def _receiver(index: int, topology: dict, ports, queue, results) -> None:
    _die_with_parent()
    import torch

    torch.set_num_threads(1)
    from rollway.common.v1 import common_pb2
    from rollway.rollout.v1 import rollout_pb2
    from rollway.rollout.weight_sync.receiver import WeightReceiver

    model = _meta_model(_hf_config(topology["size"])).to_empty(device="cpu")
    model.tie_weights()  # to_empty made the tied pair two tensors
    receiver = WeightReceiver(BenchEngine(model))
    spec = _group_spec(ports["weights"], 1 + topology["rollout_services"])
    spec.rank_offset = 1 + index
    receiver.init_group(spec)
    group = receiver.group
    buffer = torch.empty(sum(p.numel() * 4 for p in model.parameters()), dtype=torch.uint8)
    for _ in range(2):  # the raw broadcasts
        group.exchange_status(0)
        group.broadcast(buffer, src=0).wait()
        group.exchange_status(0)
    del buffer

    def update(acknowledge: bool):
        manifest = common_pb2.WeightManifest.FromString(queue.get(timeout=600))
        request = rollout_pb2.UpdateWeightsRequest(manifest=manifest, acknowledge=acknowledge)
        return receiver.update(request), time.monotonic()

    row = {}
    for _ in range(UPDATES):  # the last one is measured: by then both staging sets exist
        group.exchange_status(0)
        reply, row["committed"] = update(acknowledge=True)
    row.update(
        wire=reply.timings.wire_seconds, verify=reply.timings.verify_seconds, load=reply.timings.load_seconds
    )
    if topology["with_disk"]:
        group.exchange_status(0)
        _, row["disk_committed"] = update(acknowledge=False)
    results.put((f"receiver{index}", row))
    group.exchange_status(0)
    receiver.close()


def _run_topology(size: str, num_ranks: int, num_receivers: int, with_disk: bool) -> dict:
    import torch.multiprocessing as mp

    topology = {
        "size": size,
        "trainer_ranks": num_ranks,
        "rollout_services": num_receivers,
        "with_disk": with_disk,
    }
    ctx = mp.get_context("forkserver")  # children fork from a server that imported torch once
    ctx.set_forkserver_preload(PRELOAD)
    ports = {"trainer": _free_port(), "weights": _free_port()}
    queues = [ctx.Queue() for _ in range(num_receivers)]
    results = ctx.Queue()
    workdir = tempfile.mkdtemp(prefix="bench-weight-sync-")
    procs = [
        ctx.Process(target=_trainer, args=(r, topology, ports, queues, results, workdir))
        for r in range(num_ranks)
    ]
    procs += [
        ctx.Process(target=_receiver, args=(i, topology, ports, queues[i], results))
        for i in range(num_receivers)
    ]
    os.environ.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    try:
        for proc in procs:
            proc.start()
        rows = _collect(results, procs, 1 + num_receivers)
        for proc in procs:
            proc.join(10)  # they are done; a slow interpreter exit is not waited for
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return _row(topology, rows)


def _collect(results, procs, count: int, timeout: float = 900.0) -> dict:
    """`count` results; fails as soon as a process died instead of waiting for its result."""
    import queue

    rows, deadline = {}, time.monotonic() + timeout
    while len(rows) < count:
        try:
            key, row = results.get(timeout=1.0)
            rows[key] = row
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise RuntimeError(f"benchmark processes failed (exit codes {failed}) or timed out") from None
    return rows


def _row(topology: dict, rows: dict) -> dict:
    trainer = rows.pop("trainer")
    receivers = list(rows.values())
    num_bytes = trainer["num_bytes"]
    seconds = max(r["committed"] for r in receivers) - trainer["started"]
    gb_per_s, raw_gb_per_s = num_bytes / seconds / 1e9, num_bytes / trainer["raw_seconds"] / 1e9
    row = {
        "size": topology["size"],
        "params_m": round(num_bytes / 4 / 1e6, 1),
        "trainer_ranks": topology["trainer_ranks"],
        "rollout_services": topology["rollout_services"],
        "num_buckets": trainer["num_buckets"],
        "seconds": seconds,
        "gb_per_s": gb_per_s,
        "raw_gb_per_s": raw_gb_per_s,
        "ratio_vs_raw_broadcast": gb_per_s / raw_gb_per_s,
        "plan_seconds": trainer["plan_seconds"],
        "receiver_verify_seconds": max(r["verify"] for r in receivers),
        "receiver_load_seconds": max(r["load"] for r in receivers),
    }
    if topology["with_disk"]:
        row["disk_seconds"] = max(r["disk_committed"] for r in receivers) - trainer["disk_started"]
        row["disk_gb_per_s"] = num_bytes / row["disk_seconds"] / 1e9
    return row


def run(quick: bool) -> BenchResult:
    sizes = ["10M"] if quick else list(SIZES)
    rows = []
    for size in sizes:
        for num_ranks, num_receivers in TOPOLOGIES:
            rows.append(
                _run_topology(size, num_ranks, num_receivers, with_disk=(num_ranks, num_receivers) == (1, 1))
            )
            print(rows[-1], flush=True)
    units = {"seconds": "s", "gb_per_s": "GB/s", "raw_gb_per_s": "GB/s", "disk_seconds": "s",
             "disk_gb_per_s": "GB/s", "plan_seconds": "s", "receiver_verify_seconds": "s",
             "receiver_load_seconds": "s", "params_m": "M"}  # fmt: skip
    return BenchResult(
        name="weight_sync",
        rows=rows,
        units=units,
        config={
            "dtype": "float32",
            "bucket_size_bytes": BUCKET_BYTES,
            "backend": "gloo (loopback)",
            "vocab_size": 32000,
            "sizes": {k: SIZES[k] for k in sizes},
            "acknowledge": True,
        },  # fmt: skip
        notes="third (steady-state) update, plan pass to last commit; raw = one flat-buffer broadcast",
    )
