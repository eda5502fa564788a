"""LoRA adapters (peft) on the FSDP2 model: only the adapters train; the weights others see are merged.

load:   peft.inject_adapter_in_model on the meta model (no PeftModel wrapper: the class,
        _no_split_modules and the forward stay those of the HF model); rank 0 renames the
        wrapped base weights (q_proj.weight -> q_proj.base_layer.weight) and initialises the
        adapters (A: kaiming-uniform from --seed, B: zeros, so step 0 is the base model);
        everything except lora_A/lora_B is frozen before fully_shard.
merged: W + (lora_alpha / lora_rank) * B @ A under the HF name (q_proj.weight): what the HF
        export, the weights checksum and weight pushes see (weights.py asks here).
save:   a peft adapter directory (adapter_model.safetensors, adapter_config.json) that
        PeftModel.from_pretrained(base, dir) loads.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

ADAPTER = "default"
BASE_LAYER = ".base_layer."


def is_adapter_name(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def hf_name(name: str) -> str:
    """The Hugging Face name of a (possibly LoRA-wrapped) parameter or buffer."""
    return name.replace(BASE_LAYER, ".")


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module name -> peft LoRA layer (empty without LoRA)."""
    if not any(is_adapter_name(name) for name, _ in model.named_parameters()):
        return {}  # and no peft import for models without adapters
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def lora_config(config):
    """The peft LoraConfig of the trainer settings (no dropout: exact, reproducible log-probs)."""
    from peft import LoraConfig

    targets = list(config.lora_target_modules)
    return LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        target_modules=targets[0] if targets == ["all-linear"] else targets,
        lora_dropout=0.0,
        bias="none",
    )


def apply_lora(model: torch.nn.Module, full_state_dict: dict[str, torch.Tensor], config, rank: int) -> None:
    """Inject adapters into the (meta) model and make rank 0's full state dict match it."""
    from peft import inject_adapter_in_model
    from peft.tuners.lora import Linear as LoraLinear

    try:
        inject_adapter_in_model(lora_config(config), model)
    except ValueError as exc:  # peft: target modules not found
        raise ValueError(f"lora_target_modules: {exc}") from None
    layers = lora_layers(model)
    for name, layer in layers.items():
        if not isinstance(layer, LoraLinear) or not isinstance(layer.base_layer, torch.nn.Linear):
            raise ValueError(
                f"lora_target_modules: {name} is not a linear layer (only nn.Linear is supported)"
            )
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_name(name))
    if rank != 0:
        return
    generator = torch.Generator().manual_seed(config.seed)
    for name, layer in layers.items():
        for suffix in ("weight", "bias"):
            if f"{name}.{suffix}" in full_state_dict:
                full_state_dict[f"{name}.base_layer.{suffix}"] = full_state_dict.pop(f"{name}.{suffix}")
        a = torch.empty(layer.lora_A[ADAPTER].weight.shape)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)  # peft's default init
        full_state_dict[f"{name}.lora_A.{ADAPTER}.weight"] = a
        full_state_dict[f"{name}.lora_B.{ADAPTER}.weight"] = torch.zeros(layer.lora_B[ADAPTER].weight.shape)


@contextmanager
def adapters_disabled(model: torch.nn.Module):
    """The base model's forward (the reference policy of a LoRA run) inside the block.

    Sets peft's flag directly: peft's enable_adapters() would also flip requires_grad of the
    sharded adapter parameters, which FSDP2 has already grouped."""
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


# --- merged views (every rank calls these: gathering a shard is a collective) -------------------
def hf_named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers under their HF names; LoRA adapters left out (they are merged)."""
    tensors = {hf_name(n): p for n, p in model.named_parameters() if not is_adapter_name(n)}
    tensors.update((hf_name(n), b) for n, b in model.named_buffers())
    return tensors


def hf_parameter_names(model: torch.nn.Module) -> list[str]:
    """HF names of the parameters, sorted (tied weights once; adapters merged, not listed)."""
    return sorted(hf_name(n) for n, _ in model.named_parameters() if not is_adapter_name(n))


def adapters_by_weight(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """HF weight name -> (lora_A, lora_B, scaling) of every LoRA-wrapped weight."""
    return {
        f"{name}.weight": (layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight, layer.scaling[ADAPTER])
        for name, layer in lora_layers(model).items()
    }


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The full value of a (possibly sharded) tensor on every rank."""
    tensor = tensor.detach()
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def merged(weight: torch.Tensor, adapter: tuple[torch.Tensor, torch.Tensor, float] | None) -> torch.Tensor:
    """W + scaling * B @ A in fp32 (W alone without an adapter); `weight` is already full."""
    if adapter is None:
        return weight
    lora_a, lora_b, scaling = adapter
    delta = full(lora_b).float() @ full(lora_a).float()
    return (weight.float() + scaling * delta).to(weight.dtype)


def peft_name(name: str) -> str:
    """Key of an adapter parameter in a peft adapter file."""
    return "base_model.model." + name.replace(f".{ADAPTER}.", ".")


def save_adapter(model: torch.nn.Module, config, out_dir: Path) -> None:
    """Every rank: gather the adapters; rank 0 writes a peft adapter directory."""
    tensors = {
        peft_name(name): full(param).cpu().contiguous()
        for name, param in sorted(model.named_parameters())
        if is_adapter_name(name)
    }
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    peft_config = lora_config(config)
    peft_config.base_model_name_or_path = config.hf_checkpoint
    peft_config.save_pretrained(str(out_dir))
