"""Loading a Hugging Face checkpoint for serving, and loading named tensors into it in place."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rollway.common.log import get_logger
from rollway.common.model_load_log import logged_model_load
from rollway.common.weights_checksum import dtype_from_name
from rollway.rollout.engines.base import EngineError, WeightLoadError

log = get_logger("rollway.rollout.engines.hf_weights")


def resolve_device(device: str) -> torch.device:
    """`auto` is cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_checkpoint(path: str) -> Path:
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise EngineError(f"hf_checkpoint: {path} is not a Hugging Face model directory (no config.json)")
    return directory


def load_model(path: str, dtype: str, device: torch.device, attn_implementation: str) -> torch.nn.Module:
    """The model in eval mode on `device`, weights in `dtype`."""
    with logged_model_load(log, path, dtype) as loaded:
        model = AutoModelForCausalLM.from_pretrained(
            str(check_checkpoint(path)), dtype=dtype_from_name(dtype), attn_implementation=attn_implementation
        )
        loaded.append(model)
    return model.to(device).eval().requires_grad_(False)


def load_tokenizer(path: str):
    return AutoTokenizer.from_pretrained(str(check_checkpoint(path)))


def eos_token_ids(path: str, tokenizer) -> frozenset[int]:
    """EOS ids from the tokenizer, the model config and generation_config.json (all of them stop)."""
    ids: set[int] = set()

    def add(value) -> None:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))

    add(tokenizer.eos_token_id)
    add(AutoConfig.from_pretrained(path).eos_token_id)
    if (Path(path) / "generation_config.json").is_file():
        add(GenerationConfig.from_pretrained(path).eos_token_id)
    return frozenset(ids)


def loadable_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every name a weight update may use: parameters and persistent buffers, tied aliases included."""
    return dict(model.state_dict(keep_vars=True))


def load_named_tensors(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy each (name, tensor) into the model in place after checking name, shape and dtype.

    Each tensor is checked before it is copied, so an error names the first bad tensor; tensors
    before it have already been loaded (callers check a manifest first when that matters).
    """
    targets = loadable_tensors(model)
    count = 0
    with torch.no_grad():
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                raise WeightLoadError(
                    f"load_weights: unknown tensor {name!r} (not a parameter of the served model)"
                )
            if tuple(tensor.shape) != tuple(target.shape):
                raise WeightLoadError(
                    f"load_weights: {name} has shape {tuple(tensor.shape)}, the served model has {tuple(target.shape)}"
                )
            if tensor.dtype != target.dtype:
                raise WeightLoadError(
                    f"load_weights: {name} has dtype {tensor.dtype}, the served model uses {target.dtype}"
                )
            target.copy_(tensor)
            count += 1
    return count


def swap_named_tensors(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Make each tensor the storage of the parameter or buffer of that name, without copying.

    Everything is checked before the first swap, so a bad name leaves the model untouched. A tied
    weight is one Parameter under two names: swapping it under either name updates both."""
    targets = loadable_tensors(model)
    pairs = list(named_tensors)
    for name, tensor in pairs:
        target = targets.get(name)
        if target is None:
            raise WeightLoadError(
                f"swap_weights: unknown tensor {name!r} (not a parameter of the served model)"
            )
        if (
            tuple(tensor.shape) != tuple(target.shape)
            or tensor.dtype != target.dtype
            or tensor.device != target.device
        ):
            raise WeightLoadError(
                f"swap_weights: {name} is {tensor.dtype} {tuple(tensor.shape)} on {tensor.device}, the served "
                f"model has {target.dtype} {tuple(target.shape)} on {target.device}"
            )
    buffers = {name for name, _ in model.named_buffers()}
    with torch.no_grad():
        for name, tensor in pairs:
            if name in buffers:
                module_name, _, attr = name.rpartition(".")
                setattr(model.get_submodule(module_name), attr, tensor)  # stays a buffer, as persistent
            else:
                targets[name].data = tensor
    return len(pairs)
