"""Full (unsharded) weights in name order, and their checksum.

The weights are `model.named_parameters()` (tied weights once, under their first name, as
transformers' own `named_parameters` lists them) plus persistent buffers, sorted by name, with
Hugging Face names. Gathering a full tensor is a collective: every rank iterates in the same
order, and only rank 0 keeps the values.

Checksum (WeightChecksum, and the manifest of a weight push): sha256 over, for each tensor in
that order, the UTF-8 name, one zero byte, and the tensor's raw little-endian bytes after a cast
to the serving dtype (contiguous, row-major). A receiver computing the same over its engine's
weights gets the same digest exactly when every value matches bit for bit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def weight_names(model: torch.nn.Module) -> list[str]:
    """Names of the tensors that make up the weights, sorted."""
    persistent = {
        f"{module_name}.{name}" if module_name else name
        for module_name, module in model.named_modules()
        for name in module._buffers
        if name not in module._non_persistent_buffers_set
    }
    return sorted({name for name, _ in model.named_parameters()} | persistent)


def iter_full_weights(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor on CPU) in name order; every rank must iterate, rank 0 gets the values
    (other ranks get empty tensors)."""
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    rank = dist.get_rank() if dist.is_initialized() else 0
    for name in weight_names(model):
        tensor = tensors[name].detach()
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if rank != 0:
            yield name, torch.empty(0)
            continue
        # A copy: the caller may expose the bytes (numpy), which must never pin a parameter's storage.
        yield name, tensor.to(device="cpu", dtype=dtype or tensor.dtype, copy=True)


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """Raw bytes of a tensor (any dtype, bfloat16 included), row-major."""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def weights_checksum(named_tensors: Iterator[tuple[str, torch.Tensor]]) -> tuple[str, int]:
    """(sha256 hex digest, number of tensors) as described in the module docstring."""
    digest = hashlib.sha256()
    count = 0
    for name, tensor in named_tensors:
        digest.update(name.encode())
        digest.update(b"\x00")
        digest.update(tensor_bytes(tensor))
        count += 1
    return digest.hexdigest(), count
