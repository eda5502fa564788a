"""The trainer's send passes on 2 real gloo ranks with FSDP2: the gather-free checksum pass
(each rank sums its own shards, one all-reduce) equals the checksum of the gathered buckets,
also for uneven shards, odd sizes (unaligned offsets) and a cast to bfloat16."""

from __future__ import annotations

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard

from rollway.common.bucket_checksum import BucketChecksum, as_bytes

BUCKET_BYTES = 96


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(13, 6), torch.nn.Linear(6, 7), torch.nn.Linear(7, 3))
    model.register_buffer("scale", torch.arange(5.0))  # a persistent buffer: not sharded
    return model


def _rank(rank: int, store_path: str, out_path: str) -> None:
    from rollway.trainer.weight_send import checksum_pass, plan_layout

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    model = _model()
    for module in model:
        fully_shard(module)
    fully_shard(model)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        buckets = plan_layout(model, dtype, BUCKET_BYTES)
        planned = checksum_pass(model, buckets, rank)
        full = {name: t.full_tensor() for name, t in model.named_parameters()}
        if rank == 0:
            full.update(dict(model.named_buffers()))
            expected = []
            for bucket in buckets:
                acc = BucketChecksum()
                for entry in bucket.entries:
                    acc.update(as_bytes(full[entry.name].to(dtype).contiguous()))
                expected.append(acc.hexdigest())
            results[str(dtype)] = ([b.checksum for b in planned.buckets], expected, len(buckets))
    if rank == 0:
        with open(out_path, "wb") as f:
            pickle.dump(results, f)
    dist.destroy_process_group()


def test_sharded_checksum_pass_equals_the_checksum_of_the_gathered_buckets(tmp_path):
    out = tmp_path / "result.pkl"
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    results = pickle.loads(out.read_bytes())
    for dtype, (planned, expected, num_buckets) in results.items():
        assert num_buckets > 2, dtype  # several buckets, tensors at unaligned offsets
        assert planned == expected, dtype
