"""The trainer's send passes on 2 real gloo ranks with FSDP2: the gather-free checksum pass
(each rank sums its own shards, one all-reduce) equals the checksum of the gathered buckets, and
the ranged gather (each rank sends its byte ranges to rank 0) rebuilds every bucket byte for byte,
also for uneven shards, a tensor with fewer rows than ranks, odd sizes (unaligned offsets) and a
cast to bfloat16."""

from __future__ import annotations

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard

from rollway.common.process_exit import exit_without_teardown
from rollway.common.weight_sync.bucket_checksum import BucketChecksum, as_bytes

BUCKET_BYTES = 96


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(13, 6), torch.nn.Linear(6, 7), torch.nn.Linear(7, 3), torch.nn.Linear(3, 1)
    )
    model.register_buffer("scale", torch.arange(5.0))  # a persistent buffer: not sharded
    return model


def _rank(rank: int, store_path: str, out_path: str) -> None:
    from rollway.trainer.weight_sync.base import checksum_pass, plan_layout
    from rollway.trainer.weight_sync.gather import RangeGather, possible

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
        ranges = RangeGather(model, buckets, rank)
        if rank != 0:
            for bucket in buckets:
                ranges.send(bucket)
        else:
            full.update(dict(model.named_buffers()))
            expected, packed, gathered = [], [], []
            for bucket in buckets:
                acc = BucketChecksum()
                for entry in bucket.entries:
                    acc.update(as_bytes(full[entry.name].to(dtype).contiguous()))
                expected.append(acc.hexdigest())
                packed.append(
                    torch.cat(
                        [as_bytes(full[e.name].to(dtype).contiguous()) for e in bucket.entries]
                    ).tolist()
                )
                buffer = torch.full((bucket.padded_size + 8,), 0xAB, dtype=torch.uint8)
                ranges.gather_into(bucket, buffer)
                gathered.append((buffer[: bucket.num_bytes].tolist(), buffer[bucket.num_bytes :].tolist()))
            results[str(dtype)] = {
                "planned": [b.checksum for b in planned.buckets],
                "expected": expected,
                "num_buckets": len(buckets),
                "packed": packed,
                "gathered": gathered,
                "possible": possible(model, buckets),
            }
    if rank == 0:
        with open(out_path, "wb") as f:
            pickle.dump(results, f)
    dist.destroy_process_group()
    exit_without_teardown(0)  # the results are written; gloo may abort in interpreter teardown


def test_sharded_checksum_and_ranged_gather_equal_the_gathered_buckets(tmp_path):
    out = tmp_path / "result.pkl"
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    results = pickle.loads(out.read_bytes())
    for dtype, result in results.items():
        assert result["num_buckets"] > 2, dtype  # several buckets, tensors at unaligned offsets
        assert result["planned"] == result["expected"], dtype
        assert result["possible"], dtype  # FSDP2's Shard(0) on a 1-D mesh: gathered by ranges
        for packed, (gathered, beyond) in zip(result["packed"], result["gathered"], strict=True):
            assert gathered == packed, dtype
            assert set(beyond) == {0xAB}, dtype  # nothing written past the bucket
