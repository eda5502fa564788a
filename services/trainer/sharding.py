"""FSDP2: shard the meta model on every rank and fill it from rank 0.

`fully_shard` wraps each decoder layer (the classes in `_no_split_modules`), the input and output
embeddings when they are not tied (a tied pair must stay in one group: the root), then the root.
Parameters are fp32 masters; MixedPrecisionPolicy casts them to `--dtype` for compute and
reduces gradients in fp32. Gradients are summed, not averaged, across ranks: the loss is already
scaled by global denominators (see loss/losses.py), so FSDP's default division by the world size is
switched off.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from rollway.common.log import get_logger
from rollway.common.weights_checksum import dtype_from_name
from rollway.trainer.config import TrainerConfig
from rollway.trainer.distributed import RankInfo
from rollway.trainer.model_loading import LoadedModel, broadcast_buffers

log = get_logger("rollway.trainer.sharding")

# Names accepted for --dtype and WeightChecksum.dtype ("auto": bfloat16 on CUDA, float32 on CPU).
DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32")


def resolve_dtype(name: str) -> torch.dtype:
    """The torch dtype of a --dtype name."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPE_NAMES)} (got {name!r})")
    return dtype_from_name(name)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise RuntimeError(f"{type(model).__name__}: no decoder layers found (_no_split_modules={names})")
    return layers


def _is_tied(model: torch.nn.Module) -> bool:
    output = model.get_output_embeddings()
    return output is not None and output.weight is model.get_input_embeddings().weight


def shard_model(loaded: LoadedModel, config: TrainerConfig, info: RankInfo) -> torch.nn.Module:
    """fully_shard the meta model, materialise it on the device and load rank 0's weights."""
    model = loaded.model
    if config.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    kwargs = {
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=resolve_dtype(config.dtype), reduce_dtype=torch.float32
        ),
    }
    if config.fsdp_cpu_offload and info.device.type == "cpu":
        log.warning("fsdp_cpu_offload does nothing on CPU: the parameters, gradients and optimizer "
                    "state are in host memory already")  # fmt: skip
    if config.fsdp_cpu_offload:
        # Pinned host memory needs a GPU; on a CPU-only machine offloading is a no-op anyway.
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for layer in _decoder_layers(model):
        fully_shard(layer, **kwargs)
    if not _is_tied(model):
        fully_shard(model.get_input_embeddings(), **kwargs)
        fully_shard(model.get_output_embeddings(), **kwargs)
    fully_shard(model, **kwargs)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    model.to_empty(device="cpu" if config.fsdp_cpu_offload else info.device)
    set_model_state_dict(
        model,
        loaded.full_state_dict,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=True),
    )
    broadcast_buffers(model, loaded.buffers, info.device)
    loaded.full_state_dict.clear()
    return model
