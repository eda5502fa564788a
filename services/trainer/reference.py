"""The reference policy of the KL terms (`--ref-load`, default: the starting checkpoint).

A second FSDP2 model, frozen, sharded like the policy but with CPUOffloadPolicy: its shards live
in host memory and each layer visits the accelerator only during its own forward (Miles keeps
its reference on CPU the same way). It is built on first use - the first TrainStep that needs
ref log-probs, or ComputeLogProbs with use_reference - by every rank at once; the engine holds it
and computes its logits (TrainerEngine.reference_logits).

With LoRA and no --ref-load the reference is the policy itself with its adapters switched off:
exactly the base model, at no extra memory.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rollway.common.log import get_logger
from rollway.trainer.model_loading import ModelLoadError, load_model, read_hf_config
from rollway.trainer.sharding import shard_model
from rollway.trainer.tiled_mlp import enable_tiled_mlp


def shares_policy(config) -> bool:
    """True when the reference is the LoRA policy with adapters off."""
    return bool(config.lora_rank) and not config.ref_load


def check_reference(config) -> None:
    """At start-up: --ref-load must be a readable model with the policy's vocabulary."""
    if not config.ref_load:
        return
    try:
        ref, policy = read_hf_config(config.ref_load), read_hf_config(config.hf_checkpoint)
    except ModelLoadError as exc:
        raise ModelLoadError(f"ref_load: {exc}".replace("hf_checkpoint: ", "")) from None
    if ref.vocab_size != policy.vocab_size:
        raise ModelLoadError(
            f"ref_load: vocabulary of {ref.vocab_size} tokens, the policy has {policy.vocab_size}"
        )


def build_reference(config, info) -> torch.nn.Module:
    """Every rank: load --ref-load (or the starting checkpoint) frozen, sharded, offloaded to CPU."""
    ref_config = replace(
        config,
        hf_checkpoint=config.ref_load or config.hf_checkpoint,
        fsdp_cpu_offload=True,
        gradient_checkpointing=False,
        lora_rank=0,
    )
    loaded = load_model(ref_config, info.rank)
    if config.tiled_mlp:  # the same arithmetic as the policy: equal weights give equal log-probs
        enable_tiled_mlp(loaded.model, config.tiled_mlp_shards, set(loaded.model._no_split_modules or []))
    model = shard_model(loaded, ref_config, info)
    model.requires_grad_(False)
    model.eval()
    get_logger("rollway.trainer.reference").info("reference model ready", path=ref_config.hf_checkpoint)
    return model
