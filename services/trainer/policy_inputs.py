"""Per-token inputs of policy_loss that the trainer computes itself, before the first optimizer
step of a TrainStep (every rank, for its own samples, over the same micro-batches it trains on):

    old_log_probs   no-grad forward of the policy (not with --use-rollout-logprobs; skipped when
                    the rollout makes one optimizer step and nothing else needs them: the loss
                    then uses the current log-probs detached, the same values)
    ref_log_probs   no-grad forward of the reference (--use-kl-loss, or --kl-coef shaping)
    advantages      the token part of the run's estimator (returns.py): reinforce_plus_plus(_baseline)
                    add the KL penalty (and returns); with --normalize-advantages every estimator's
                    values are whitened over the whole batch; otherwise the coordinator's values stay

Log-probs use the rollout temperature, like the engine's. Values are stored per response token
in each SequenceItem's extras, and the names are added to every step's extra_names so that
build_micro_batch lays them out at target positions like the Sample fields.
"""

from __future__ import annotations

import torch

from rollway.trainer.config import TOKEN_LEVEL_ESTIMATORS, TrainerConfig
from rollway.trainer.kl import approx_kl
from rollway.trainer.log_probs import response_values, token_log_probs
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.returns import reinforce_plus_plus_baseline, reinforce_plus_plus_returns, whiten
from rollway.trainer.step_timer import StepTimer


def loss_temperature(settings: TrainerConfig) -> float:
    """Logits of policy_loss are divided by the rollout temperature (Miles); SFT's are not."""
    return settings.rollout_temperature if settings.loss_type == "policy_loss" else 1.0


def kl_shaping(settings: TrainerConfig) -> bool:
    return bool(settings.kl_coef) and settings.advantage_estimator in TOKEN_LEVEL_ESTIMATORS


def needs_reference(settings: TrainerConfig) -> bool:
    return settings.use_kl_loss or kl_shaping(settings)


def needs_old_pass(settings: TrainerConfig, num_steps: int) -> bool:
    if settings.use_rollout_logprobs:
        return False
    return num_steps > 1 or kl_shaping(settings)


def _forward_log_probs(engine, mb, settings: TrainerConfig, reference: bool) -> dict[int, list[float]]:
    with torch.no_grad():
        logits = engine.reference_logits(mb) if reference else engine.logits(mb)
        logp, _ = token_log_probs(
            logits,
            mb.target_ids.to(logits.device),
            temperature=loss_temperature(settings),
            chunk_size=settings.log_probs_chunk_size,
        )
    return response_values(logp, mb.spans)


def _compute_log_probs(engine, steps, settings: TrainerConfig, names: list[str], timer: StepTimer) -> None:
    engine.model.eval()
    for step in steps:
        for items in step.micro_batches:  # every rank has as many micro-batches: FSDP collectives match
            with timer.phase("data"):
                mb = engine.build_micro_batch(items, settings.packing, extra_names=())
            for name in names:
                # perf/log_probs_time (the old policy) or perf/ref_log_probs_time
                with timer.phase("ref_log_probs" if name == "ref_log_probs" else "log_probs"):
                    values = _forward_log_probs(engine, mb, settings, reference=name == "ref_log_probs")
                for item in items:
                    item.extras[name] = values[item.index]


def completes_advantages(settings: TrainerConfig) -> bool:
    """Whether the trainer rewrites the coordinator's advantages (its token part of the estimator)."""
    return settings.advantage_estimator in TOKEN_LEVEL_ESTIMATORS or settings.normalize_advantages


def _token_level_advantages(items: list[SequenceItem], settings: TrainerConfig, distributed: bool) -> None:
    values, masks = [], []
    for item in items:
        advantages = torch.tensor(item.extras["advantages"], dtype=torch.float32)
        mask = torch.tensor(item.loss_mask, dtype=torch.float32)
        kl = torch.zeros_like(advantages)
        if kl_shaping(settings):
            old = item.extras["rollout_log_probs" if settings.use_rollout_logprobs else "old_log_probs"]
            kl = approx_kl(
                torch.tensor(old), torch.tensor(item.extras["ref_log_probs"]), settings.kl_loss_type
            )
        if settings.advantage_estimator == "reinforce_plus_plus":
            advantages = reinforce_plus_plus_returns(advantages, kl, mask, settings.kl_coef, settings.gamma)
        elif settings.advantage_estimator == "reinforce_plus_plus_baseline":
            advantages = reinforce_plus_plus_baseline(advantages, kl, settings.kl_coef)
        values.append(advantages)
        masks.append(mask)
    if settings.normalize_advantages:  # every rank calls it (a collective), even with no items
        values = whiten(values, masks, distributed)
    for item, value in zip(items, values, strict=True):
        item.extras["advantages"] = value.tolist()


def prepare_policy_inputs(
    engine, steps: list, settings: TrainerConfig, timer: StepTimer | None = None
) -> None:
    """Every rank, before the first optimizer step: fill its items' computed inputs (module doc)."""
    names = []
    if needs_old_pass(settings, len(steps)):
        names.append("old_log_probs")
    if needs_reference(settings):
        names.append("ref_log_probs")
    if names:
        _compute_log_probs(engine, steps, settings, names, timer or StepTimer(engine.info.device))
    for step in steps:
        step.extra_names = tuple(sorted({*step.extra_names, *names}))
    if completes_advantages(settings):
        items = [item for step in steps for mb in step.micro_batches for item in mb]
        _token_level_advantages(items, settings, distributed=engine.info.world_size > 1)
