"""Full (unsharded) weights in name order, for the HF export and the weights checksum.

Gathering a full tensor from FSDP2 shards is a collective: every rank iterates over the same
names in the same order, and only rank 0 keeps the values (other ranks get empty tensors).

The checksum is rollway.common.weights_checksum (the function the rollout engines use too),
over `named_parameters()` with Hugging Face names: tied weights once, under their first name.
With LoRA (lora.py) every function here sees the merged weights under their HF names.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from rollway.common.weights_checksum import weights_checksum
from rollway.trainer.lora import (
    adapters_by_weight,
    full,
    hf_name,
    hf_named_tensors,
    hf_parameter_names,
    merged,
)


def parameter_names(model: torch.nn.Module) -> list[str]:
    """Names of the parameters, sorted (tied weights once; LoRA adapters merged, not listed)."""
    return hf_parameter_names(model)


def weight_names(model: torch.nn.Module) -> list[str]:
    """Parameters plus persistent buffers, sorted: what a state dict file must hold."""
    persistent = {
        hf_name(f"{module_name}.{name}" if module_name else name)
        for module_name, module in model.named_modules()
        for name, _ in module.named_buffers(recurse=False, remove_duplicate=False)
        if name not in module._non_persistent_buffers_set  # torch has no public accessor
    }
    return sorted(set(parameter_names(model)) | persistent)


def iter_full_tensors(
    model: torch.nn.Module, names: list[str], dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor on CPU) for `names`, in order; every rank must iterate to the end."""
    tensors = hf_named_tensors(model)
    adapters = adapters_by_weight(model)
    rank = dist.get_rank() if dist.is_initialized() else 0
    for name in names:
        tensor = merged(full(tensors[name]), adapters.get(name))
        if rank != 0:
            yield name, torch.empty(0)
            continue
        # A copy: the caller may expose the bytes (numpy), which must never pin a parameter's storage.
        yield name, tensor.to(device="cpu", dtype=dtype or tensor.dtype, copy=True)


def full_weights_checksum(model: torch.nn.Module, dtype: torch.dtype) -> tuple[str, int]:
    """(sha256 digest, number of tensors) on rank 0; ("", 0) on the other ranks."""
    tensors = iter_full_tensors(model, parameter_names(model), dtype)
    if dist.is_initialized() and dist.get_rank() != 0:
        for _ in tensors:  # take part in every gather
            pass
        return "", 0
    return weights_checksum(tensors, dtype)
