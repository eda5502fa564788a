"""Scenarios of test_rl_ranks.py, run on every rank by rl_harness.run_scenarios (module-level so
that spawned ranks can unpickle them)."""

from __future__ import annotations

import random

import torch
import torch.distributed as dist

from rollway.common.config import from_dict
from rollway.trainer.config import TrainerConfig
from rollway.trainer.lora import is_adapter_name
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.tiled_mlp import TILED_ATTRIBUTE
from rollway.trainer.train_plan import plan_log_probs
from support.rl_harness import make_config, new_engine, step_gradients, train


def rl_batch(seed: int, size: int = 6) -> list[SequenceItem]:
    """Samples with prompts, masked stretches, +/- advantages, rollout log-probs, two sources."""
    rng = random.Random(seed)
    items = []
    for index in range(size):
        prompt, response = rng.randint(1, 4), rng.randint(3, 14)
        tokens = [rng.randint(3, 300) for _ in range(prompt + response)]
        mask = [1] * response
        if response > 5:
            mask[2:4] = [0, 0]
        advantage = (-1.0) ** index * (0.5 + index / 4)
        extras = {
            "advantages": [advantage] * response,
            "rollout_log_probs": [-rng.uniform(4.5, 6.5) for _ in range(response)],
        }
        items.append(SequenceItem(index, tokens, prompt, mask, extras, source="ab"[index % 2]))
    return items


def scenario_gradients(info, model_dir: str, items, variants: dict[str, dict]) -> dict:
    """(metrics, full gradients) of the first optimizer step of each variant, same weights."""
    config = make_config(model_dir)
    engine = new_engine(info, config)
    return {
        name: step_gradients(engine, items, from_dict(TrainerConfig, overrides, base=config))
        for name, overrides in variants.items()
    }


def log_probs(engine, items, use_reference: bool) -> dict[int, list[float]] | None:
    layout = plan_log_probs(items, engine.config, engine.info.world_size)
    result = engine.log_probs(layout[engine.info.rank], 1.0, False, use_reference=use_reference)
    return None if result is None else {i: lp for i, (lp, _) in result.items()}


def scenario_step0(info, model_dir: str, items) -> dict:
    """Reference vs policy at step 0 and after two optimizer steps."""
    config = make_config(model_dir, lr=1e-2, use_kl_loss=True, kl_loss_coef=0.1, num_steps_per_rollout=2)
    engine = new_engine(info, config)
    before = (log_probs(engine, items, False), log_probs(engine, items, True))
    metrics = train(engine, items, config)
    after = (log_probs(engine, items, False), log_probs(engine, items, True))
    return {"before": before, "metrics": metrics, "after": after}


def scenario_tiled(info, model_dir: str, items, variants: dict[str, dict]) -> dict:
    """Gradients of the same step with each start-up variant (tiled MLP, checkpointing)."""
    results = {}
    for name, overrides in variants.items():
        engine = new_engine(info, make_config(model_dir, **overrides))
        tiled = sum(hasattr(m, TILED_ATTRIBUTE) for m in engine.model.modules())
        results[name] = (*step_gradients(engine, items, engine.config), tiled)
        del engine
    return results


def _full_weights(engine) -> dict[str, torch.Tensor]:
    return {
        name: (p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach()).clone()
        for name, p in engine.model.named_parameters()
    }


def _pushed_weights(model, rank: int):
    """What a weight push would send: per-bucket checksums of the planning pass, checksums of the
    gathered bytes, and the gathered tensors (rank 0; None elsewhere)."""
    from rollway.common.weight_sync.bucket_checksum import BucketChecksum, as_bytes
    from rollway.trainer.weight_sync.base import checksum_pass, gathered_tensors, plan_layout

    buckets = plan_layout(model, torch.float32, 64 * 1024)
    planned = checksum_pass(model, buckets, rank)
    sums = {b.index: BucketChecksum() for b in buckets}
    tensors = {}
    for bucket, entry, tensor in gathered_tensors(model, buckets, keep=rank == 0):
        if tensor is not None:
            sums[bucket.index].update(as_bytes(tensor))
            tensors[entry.name] = tensor.clone()
    if rank != 0:
        return None
    return [b.checksum for b in planned.buckets], [sums[b.index].hexdigest() for b in buckets], tensors


def scenario_lora(info, model_dir: str, items, out_dir: str) -> dict:
    """Train LoRA for two steps, save with an HF export; what rank 0 needs to check it."""
    config = make_config(model_dir, lr=5e-2, lora_rank=4, lora_alpha=8.0, num_steps_per_rollout=2)
    engine = new_engine(info, config)
    before = _full_weights(engine)
    ref_before = log_probs(engine, items, True)
    policy_before = log_probs(engine, items, False)
    metrics = train(engine, items, config)
    after = _full_weights(engine)
    ref_after = log_probs(engine, items, True)
    optimized = sum(len(group["params"]) for group in engine.optimizer.param_groups)
    trainable = sorted(n for n, p in engine.model.named_parameters() if p.requires_grad)
    engine.save(out_dir, hf_export=True)
    checksum = engine.checksum("float32")
    pushed = _pushed_weights(engine.model, info.rank)
    dist.barrier()
    return {
        "pushed": pushed,
        "before": before,
        "after": after,
        "ref": (policy_before, ref_before, ref_after),
        "metrics": metrics,
        "optimized": optimized,
        "trainable": trainable,
        "checksum": checksum,
        "adapter_names": [n for n in after if is_adapter_name(n)],
    }
