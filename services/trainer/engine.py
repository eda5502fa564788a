"""The per-rank training engine: every rank runs the same method with its own share of the work.

Rank 0 runs a command (commands.py) here after posting the same command to the workers
(controller.py, runtime.py); a worker's loop (worker.py) runs it on receipt. Methods only run collectives that every rank
runs in the same order, and return what rank 0 needs (other ranks' return values are dropped).
"""

from __future__ import annotations

import inspect
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rollway.common import progress
from rollway.common.config import from_dict
from rollway.common.cpu_threads import apply_cpu_threads
from rollway.trainer import checkpoint, export, lora
from rollway.trainer.async_save import BackgroundWriter
from rollway.trainer.attention import model_inputs, shares_prefixes
from rollway.trainer.config import TrainerConfig
from rollway.trainer.distributed import RankInfo
from rollway.trainer.log_probs import response_values, token_log_probs
from rollway.trainer.lora_tenants import LoraTenants
from rollway.trainer.loss.datum_losses import DATUM_LOSSES
from rollway.trainer.loss.losses import (
    LossInputs,
    aggregate,
    combine_shares,
    get_loss,
    metric_share,
    reduce_shares,
)
from rollway.trainer.loss.per_source import gather_source_losses, sample_sums
from rollway.trainer.micro_batch import MicroBatch, SequenceItem, build_micro_batch
from rollway.trainer.model_loading import load_model
from rollway.trainer.optimizer import apply_settings, build_optimizer, clip_grad_norm
from rollway.trainer.policy_inputs import complete_policy_inputs, log_prob_inputs, loss_temperature
from rollway.trainer.reference import build_reference, shares_policy
from rollway.trainer.sharding import resolve_dtype, shard_model
from rollway.trainer.step_timer import StepTimer
from rollway.trainer.tiled_mlp import enable_tiled_mlp
from rollway.trainer.train_plan import OptimizerStepPlan
from rollway.trainer.weights import full_weights_checksum


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the model's forward can compute logits at chosen positions (most HF causal LMs)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


class TrainerEngine:
    """Model shard, optimizer and step counter of one rank."""

    def __init__(self, config: TrainerConfig, info: RankInfo):
        self.config = config
        self.info = info
        if info.device.type == "cpu":
            # The ranks share the machine's cores (torchrun's LOCAL_WORLD_SIZE where a launcher
            # says how many ranks a machine holds; else all of them, as when rank 0 spawns them).
            sharers = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
            apply_cpu_threads(config.cpu_threads, sharers)
        loaded = load_model(config, info.rank)
        self.hf_config = loaded.hf_config
        if config.lora_rank:
            lora.apply_lora(loaded.model, loaded.full_state_dict, config, info.rank)
        if config.tiled_mlp:
            enable_tiled_mlp(loaded.model, config.tiled_mlp_shards, set(loaded.model._no_split_modules or []))
        self.model = shard_model(loaded, config, info)
        self.reference: torch.nn.Module | None = None  # built on first use (reference.py)
        self.optimizer: torch.optim.Optimizer | None = None
        self.global_step = 0
        self.compute_dtype = resolve_dtype(config.dtype)
        self.pad_token_id = int(getattr(self.hf_config, "pad_token_id", None) or 0)
        self.writer = BackgroundWriter(info.rank)  # async_save's write in the background
        self.lora_tenants: LoraTenants | None = None  # on first use: a trainer shared by LoRA tenants

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())  # DTensor.numel() is the full size

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[0])

    # --- commands -------------------------------------------------------------------------
    def init(self, settings: dict[str, Any]) -> None:
        """Apply training settings; build AdamW on first use."""
        self.config = from_dict(TrainerConfig, settings)
        torch.manual_seed(self.config.seed + self.info.rank)
        if self.optimizer is None:
            self.optimizer = build_optimizer(self.model, self.config)
        apply_settings(self.optimizer, self.config, self.global_step)

    def train(self, steps: list[OptimizerStepPlan]) -> list[dict[str, float]]:
        """Run each optimizer step; return per-step metrics (global values, same on every rank;
        per-source losses on rank 0 only). The first step's metrics carry the time breakdown of
        the whole call (perf/*_time, step_timer.py)."""
        if not steps:
            return []
        started = time.perf_counter()
        timer = StepTimer(self.info.device)
        # The plan gives every step the same settings: parse them once, not per step.
        settings = from_dict(TrainerConfig, steps[0].settings)
        if settings.loss_type == "policy_loss":  # old/ref log-probs before the first update
            self.fill_policy_inputs(steps, settings, timer)
        results = [self._optimizer_step(step, settings, timer) for step in steps]
        results[0].update(timer.metrics())
        results[0]["perf/actor_train_time"] = time.perf_counter() - started
        return results

    def log_probs(
        self,
        micro_batches: list[list[SequenceItem]],
        temperature: float,
        with_entropy: bool,
        use_reference: bool = False,
    ) -> dict[int, tuple[list[float], list[float]]] | None:
        """Response log-probs (and entropy) of this rank's samples, gathered on rank 0."""
        self.model.eval()
        results: dict[int, tuple[list[float], list[float]]] = {}
        with torch.no_grad():
            for items in micro_batches:
                progress.beat()
                mb = self.build_micro_batch(items, packing=True, extra_names=())
                logp, entropy = self.forward(
                    mb, temperature, reference=use_reference, with_entropy=with_entropy
                )
                values = response_values(logp, mb.spans)
                entropies = response_values(entropy, mb.spans) if entropy is not None else {}
                for index, lp in values.items():
                    results[index] = (lp, entropies.get(index, []))
        return self._gather_on_rank0(results)

    def save(self, directory: str, hf_export: bool, async_save: bool = False) -> list[str]:
        """Write this rank's shards (and take part in the HF export) into `directory`; the write
        errors of every rank (path and errno; empty when all wrote). A rank that cannot write
        still meets the others here, so a full disk leaves the ranks in step. With `async_save`
        the shards are only staged in memory here and written by `self.writer` in the background
        (async_save.py); the previous background write is always waited for first."""
        self.writer.wait()  # its outcome went to rank 0's controller; here: one write at a time
        path = Path(directory)
        error = ""
        staged = None
        try:
            if async_save:
                staged = checkpoint.stage(self.model, self._require_optimizer(), path)
            else:
                checkpoint.save_shards(self.model, self._require_optimizer(), path)
            if self.config.lora_rank:
                lora.save_adapter(self.model, self.config, path / "adapter")
            if hf_export:
                export.export_hf(self.model, self.hf_config, self.config.hf_checkpoint, path / "hf")
        except Exception as exc:  # noqa: BLE001 - write_error re-raises what is not a write error
            error = f"rank {self.info.rank}: {checkpoint.write_error(exc, path)}"
        errors = self._every_ranks_errors(error)
        if staged is not None and not errors:  # every rank agrees: all start, or none does
            self.writer.start(staged, path)
        return errors

    def export_hf(self, directory: str) -> list[str]:
        """Take part in a Hugging Face export into `directory` (rank 0 writes); every rank's
        write errors, as `save`."""
        path = Path(directory)
        error = ""
        try:
            export.export_hf(self.model, self.hf_config, self.config.hf_checkpoint, path)
        except Exception as exc:  # noqa: BLE001 - write_error re-raises what is not a write error
            error = f"rank {self.info.rank}: {checkpoint.write_error(exc, path)}"
        return self._every_ranks_errors(error)

    def load(self, directory: str, global_step: int) -> None:
        """Read model, optimizer and RNG from a verified checkpoint directory."""
        self.writer.wait()  # a load must not race the write of the state it replaces
        checkpoint.load_shards(self.model, self._require_optimizer(), Path(directory))
        self.global_step = global_step
        apply_settings(self.optimizer, self.config, self.global_step)
        dist.barrier()

    def forward_backward(
        self,
        micro_batches: list[list[SequenceItem]],
        loss_fn: str,
        loss_fn_config: dict[str, float],
        forward_only: bool,
    ) -> dict[int, tuple[list[float], list[float]]] | None:
        """Per-token log-probs and loss terms of this rank's datums (loss/datum_losses.py), gathered
        on rank 0; unless `forward_only`, the loss's gradients are added to the parameters'
        .grad (not cleared first: optim_step applies and clears them). Every rank runs the same
        number of micro-batches (the controller pads with empty ones) so FSDP's collectives
        pair up."""
        spec = DATUM_LOSSES[loss_fn]
        self.model.train()
        results: dict[int, tuple[list[float], list[float]]] = {}
        for k, items in enumerate(micro_batches):
            progress.beat()
            if not forward_only:  # reduce-scatter once, after this call's last micro-batch
                self.model.set_requires_gradient_sync(k == len(micro_batches) - 1)
            mb = self.build_micro_batch(items, packing=True, extra_names=spec.inputs)
            with torch.set_grad_enabled(not forward_only):
                logp, _ = self.forward(mb)
                device = logp.device
                extras = {name: t.to(device) for name, t in mb.extras.items()}
                terms = spec.fn(logp, extras, loss_fn_config) * mb.loss_mask.to(device)
                if not forward_only:
                    terms.sum().backward()
            values, losses = response_values(logp, mb.spans), response_values(terms, mb.spans)
            for index, lp in values.items():
                results[index] = (lp, losses[index])
        return self._gather_on_rank0(results)

    def optim_step(
        self,
        learning_rate: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        grad_clip_norm: float,
    ) -> dict[str, float]:
        """Apply the gradients forward_backward accumulated with these AdamW hyper-parameters
        (the caller's, not the run's schedule), then clear them. No gradient: no change."""
        optimizer = self._require_optimizer()
        for group in optimizer.param_groups:
            group.update(lr=learning_rate, betas=betas, eps=eps, weight_decay=weight_decay)
        has_grad = any(p.grad is not None for p in self.model.parameters())
        grad_norm = clip_grad_norm(self.model, grad_clip_norm)
        if has_grad and math.isfinite(grad_norm):  # a non-finite norm skips the update
            optimizer.step()
            self.global_step += 1
        optimizer.zero_grad(set_to_none=True)
        return {"train/grad_norm": grad_norm, "train/lr": learning_rate}

    def activate_adapter(self, name: str) -> None:
        """Make LoRA tenant `name`'s adapters, optimizer state, gradients and step the live ones
        (lora_tenants.py)."""
        if self.lora_tenants is None:
            self.lora_tenants = LoraTenants(self.model)
        self.global_step = self.lora_tenants.activate(name, self.optimizer, self.global_step)

    def drop_adapter(self, name: str) -> tuple[bool, int]:
        """Forget LoRA tenant `name`; (whether it was held, the tenants still held)."""
        if self.lora_tenants is None:
            return False, 0
        held, self.global_step = self.lora_tenants.drop(name, self.optimizer, self.global_step)
        return held, len(self.lora_tenants.names)

    def checksum(self, dtype: str) -> tuple[str, int]:
        """sha256 of the full weights cast to `dtype` (weights.py), on rank 0."""
        return full_weights_checksum(self.model, resolve_dtype(dtype))

    # --- forward passes ---------------------------------------------------------------------
    def fill_policy_inputs(
        self, steps: list[OptimizerStepPlan], settings: TrainerConfig, timer: StepTimer | None = None
    ) -> None:
        """Every rank, before a TrainStep's first optimizer step: the old and reference log-probs
        its items need (policy_inputs.py says which), over the micro-batches it trains on, then
        the inputs computed from them (policy_inputs.complete_policy_inputs)."""
        timer = timer or StepTimer(self.info.device)
        names = log_prob_inputs(settings, len(steps))
        if names:
            self.model.eval()
            for step in steps:
                for items in step.micro_batches:  # as many on every rank: FSDP collectives match
                    self._fill_log_probs(items, names, settings, timer)
        complete_policy_inputs(steps, settings, names, distributed=self.info.world_size > 1)

    def _fill_log_probs(
        self, items: list[SequenceItem], names: list[str], settings: TrainerConfig, timer: StepTimer
    ) -> None:
        """items' extras[name] for each of old_log_probs and ref_log_probs in `names` (no grad)."""
        with timer.phase("data"):
            mb = self.build_micro_batch(items, settings.packing, extra_names=())
        for name in names:
            reference = name == "ref_log_probs"
            # perf/ref_log_probs_time or perf/log_probs_time (the old policy)
            with timer.phase("ref_log_probs" if reference else "log_probs"), torch.no_grad():
                logp, _ = self.forward(
                    mb,
                    loss_temperature(settings),
                    reference=reference,
                    chunk_size=settings.log_probs_chunk_size,
                )
                values = response_values(logp, mb.spans)
            for item in items:
                item.extras[name] = values[item.index]

    def forward(
        self,
        mb: MicroBatch,
        temperature: float = 1.0,
        *,
        reference: bool = False,
        chunk_size: int | None = None,
        with_entropy: bool = False,
        entropy_requires_grad: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The forward pass every loop runs: log p(target) at the micro-batch's target columns
        under the policy (or the reference), and optionally the entropy (log_probs.py). Gradients
        flow as the caller's grad mode says."""
        logits = self.reference_logits(mb) if reference else self.logits(mb)
        return token_log_probs(
            logits,
            mb.target_ids.to(logits.device),
            temperature=temperature,
            chunk_size=self.config.log_probs_chunk_size if chunk_size is None else chunk_size,
            with_entropy=with_entropy,
            entropy_requires_grad=entropy_requires_grad,
        )

    def build_micro_batch(
        self, items: list[SequenceItem], packing: bool, extra_names: tuple[str, ...]
    ) -> MicroBatch:
        """`items` laid out as one micro-batch with this run's padding and prefix sharing."""
        return build_micro_batch(
            items,
            packing=packing,
            pad_multiple=self.config.pad_to_multiple,
            pad_token_id=self.pad_token_id,
            extra_names=extra_names,
            share_prefixes=shares_prefixes(self.config, packing),
        )

    def logits(self, mb: MicroBatch, model: torch.nn.Module | None = None) -> torch.Tensor:
        """Logits [rows, targets, vocab] at the micro-batch's target columns only: lm_head (and
        everything after it) skips prompts and padding."""
        model = model or self.model
        inputs = model_inputs(mb, self.config.attn_implementation, self.compute_dtype, self.info.device)
        columns = mb.logit_columns.to(self.info.device)
        if accepts_logits_to_keep(model):
            return model(**inputs, logits_to_keep=columns).logits
        return model(**inputs).logits.index_select(1, columns)

    def reference_logits(self, mb: MicroBatch) -> torch.Tensor:
        """Logits of the reference policy for a micro-batch (call under torch.no_grad()): the
        policy with its LoRA adapters off, or the reference model, built on first use (reference.py)."""
        if shares_policy(self.config):
            with lora.adapters_disabled(self.model):
                return self.logits(mb)
        if self.reference is None:
            self.reference = build_reference(self.config, self.info)
        return self.logits(mb, model=self.reference)

    # --- internals ------------------------------------------------------------------------
    def _gather_on_rank0(self, results: dict[int, Any]) -> dict[int, Any] | None:
        """Every rank's results by sample index, on rank 0 (None on the others)."""
        gathered: list[Any] | None = [None] * self.info.world_size if self.info.rank == 0 else None
        dist.gather_object(results, gathered, dst=0)
        return None if gathered is None else {i: value for part in gathered for i, value in part.items()}

    def _every_ranks_errors(self, error: str) -> list[str]:
        """The write errors of every rank ("" for none on this one), on every rank."""
        errors: list[str] = [""] * self.info.world_size
        dist.all_gather_object(errors, error)
        return [e for e in errors if e]

    def _require_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError("the optimizer is built by init; rank 0 checks this before sending")
        return self.optimizer

    def accumulate_gradients(
        self,
        step: OptimizerStepPlan,
        settings: TrainerConfig | None = None,
        timer: StepTimer | None = None,
    ) -> dict[str, float]:
        """Forward and backward of this rank's micro-batches; the step's loss metrics (global sums).

        Gradients add up in the parameters' .grad; the optimizer step is separate so that tests
        can compare gradients of equivalent splits.
        """
        settings = settings or from_dict(TrainerConfig, step.settings)
        timer = timer or StepTimer(self.info.device)
        spec = get_loss(settings.loss_type)
        self.model.train()
        totals: dict[str, torch.Tensor] = {}
        per_sample: dict[int, list[float]] = {}
        extra_names = tuple(sorted({*step.extra_names, *spec.per_token_inputs}))
        for k, items in enumerate(step.micro_batches):
            progress.beat()  # for the coordinator's hang watch (common/progress.py)
            # Reduce-scatter once, after the last micro-batch; earlier ones accumulate locally.
            self.model.set_requires_gradient_sync(k == len(step.micro_batches) - 1)
            with timer.phase("data"):
                mb = self.build_micro_batch(items, settings.packing, extra_names)
            shares, sums = self._micro_batch_loss(mb, settings, spec, step.denominators, timer)
            per_sample.update(sums)
            for name, value in shares.items():
                totals[name] = combine_shares(name, totals.get(name), value)
        metrics = reduce_shares(totals)
        metrics.update(
            gather_source_losses(per_sample, step.micro_batches, settings.calculate_per_token_loss)
        )
        return metrics

    def _optimizer_step(
        self, step: OptimizerStepPlan, settings: TrainerConfig, timer: StepTimer
    ) -> dict[str, float]:
        optimizer = self._require_optimizer()
        optimizer.zero_grad(set_to_none=True)  # nothing left over from a step that failed half-way
        metrics = self.accumulate_gradients(step, settings, timer)
        with timer.phase("optimizer"):
            grad_norm = clip_grad_norm(self.model, settings.clip_grad)
            lr = apply_settings(optimizer, settings, self.global_step)
            if math.isfinite(grad_norm):  # a non-finite norm skips the update (reported as is)
                optimizer.step()
                self.global_step += 1
            optimizer.zero_grad(set_to_none=True)
        metrics.update({"train/grad_norm": grad_norm, "train/lr": lr})
        return metrics

    def _micro_batch_loss(
        self, mb, settings, spec, denominators, timer: StepTimer
    ) -> tuple[dict[str, torch.Tensor], dict]:
        """Forward and backward of one micro-batch; its (detached) shares of the step's metrics, on
        the device, and its samples' loss sums (loss/per_source.py)."""
        with timer.phase("forward"):
            logp, entropy = self.forward(
                mb,
                loss_temperature(settings),
                chunk_size=settings.log_probs_chunk_size,
                with_entropy=spec.needs_entropy,
                entropy_requires_grad=settings.entropy_coef != 0,
            )
            device = logp.device
            mask, index = mb.loss_mask.to(device), mb.sample_index.to(device)
            inputs = LossInputs(
                log_probs=logp,
                loss_mask=mask,
                sample_index=index,
                settings=settings,
                entropy=entropy,
                extras={name: t.to(device) for name, t in mb.extras.items()},
            )
            terms = spec.fn(inputs)
            per_token = settings.calculate_per_token_loss
            loss = aggregate(terms["loss"], mask, index, denominators, per_token)
        with timer.phase("backward"):
            loss.backward()
        shares = {
            name: metric_share(name, t.detach(), mask, index, denominators, per_token)
            for name, t in terms.items()
        }
        shares["loss"] = loss.detach()
        shares["per_token_loss"] = aggregate(terms["loss"].detach(), mask, index, denominators, True)
        return shares, sample_sums(terms["loss"], mask, index)
