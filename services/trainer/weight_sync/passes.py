"""What every trainer rank runs for a push: the WeightPass command's step, chosen by its type.

    Checksums   base.checksum_pass: the buckets' checksums, for the manifest
    Broadcast   distributed.broadcast_pass: gather, rank 0 broadcasts on the weight group
    WriteFiles  disk.write_pass: gather, rank 0 writes one safetensors file per bucket

Every step starts from the same bucket layout (plan_layout gives the same result on every rank),
so the ranks' gathers stay in step.
"""

from __future__ import annotations

import torch

from rollway.common.weights_checksum import dtype_from_name
from rollway.trainer.weight_sync.base import Checksums, SendResult, checksum_pass, plan_layout
from rollway.trainer.weight_sync.disk import WriteFiles, write_pass
from rollway.trainer.weight_sync.distributed import Broadcast, broadcast_pass

WeightStep = Checksums | Broadcast | WriteFiles


def weight_pass(engine, dtype: str, bucket_size_bytes: int, step: WeightStep) -> SendResult | None:
    """`step` of a push on this rank; rank 0 returns its result, the other ranks None."""
    rank = engine.info.rank
    with torch.no_grad():
        buckets = plan_layout(engine.model, dtype_from_name(dtype), bucket_size_bytes)
        match step:
            case Checksums():
                return checksum_pass(engine.model, buckets, rank)
            case Broadcast(acknowledge, chunk_bytes, sender):
                return broadcast_pass(engine.model, buckets, rank, sender, acknowledge, chunk_bytes)
            case WriteFiles(directory):
                return write_pass(engine.model, buckets, rank, directory, engine.hf_config)
    raise TypeError(f"not a weight-pass step: {step!r}")
