"""The weights checksum both sides of a weight sync compute, so that they can be compared.

    digest, num_tensors = weights_checksum(model.named_parameters(), dtype=torch.bfloat16)

Algorithm ("sha256", the WeightsChecksum.algorithm value): tensors are taken in sorted name
order; for each one the hash is fed

    name (utf-8) + b"\\0" + dtype name (e.g. b"bfloat16") + b"\\0" + shape (b"4,128") + b"\\0"
    + the tensor's raw bytes, C-contiguous, after casting to `dtype`, on CPU (native little-endian)

and the digest is the hex sha256 of the whole stream. Name, dtype and shape go in so that two
sets with the same bytes but a different layout never collide. Which tensors go in is the
caller's convention: rollway passes `named_parameters()` of the Hugging Face model (tied weights
once, under their first name, as PyTorch lists them), with DTensor shards gathered to full
tensors first. The trainer and the rollout engine must use this function, not a copy of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

ALGORITHM = "sha256"


def tensor_bytes(tensor: torch.Tensor, dtype: torch.dtype) -> memoryview:
    """Raw bytes of `tensor` cast to `dtype`, C-contiguous, on CPU."""
    flat = tensor.detach().to(device="cpu", dtype=dtype).contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def weights_checksum(
    named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> tuple[str, int]:
    """sha256 hex digest over `named_tensors` in name order (see the module doc); and their count.

    Raises ValueError when a name appears twice (the order would be ambiguous).
    """
    tensors = dict[str, torch.Tensor]()
    for name, tensor in named_tensors:
        if name in tensors:
            raise ValueError(f"weights_checksum: tensor name {name!r} appears twice")
        tensors[name] = tensor
    hasher = hashlib.sha256()
    dtype_name = str(dtype).removeprefix("torch.")
    for name in sorted(tensors):
        tensor = tensors[name]
        shape = ",".join(str(d) for d in tensor.shape)
        hasher.update(f"{name}\0{dtype_name}\0{shape}\0".encode())
        hasher.update(tensor_bytes(tensor, dtype))
    return hasher.hexdigest(), len(tensors)


def dtype_from_name(name: str) -> torch.dtype:
    """torch dtype from its name ("bfloat16", "float32", "torch.float16", or "auto": bfloat16 on
    CUDA, float32 on CPU where bfloat16 is emulated); ValueError if unknown."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype
