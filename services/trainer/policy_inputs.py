"""Per-token inputs of policy_loss that the trainer computes itself, before the first optimizer
step of a TrainStep (every rank, for its own samples, over the same micro-batches it trains on).
What is needed, and what follows from the log-probs, are decided here, on data alone; the
forward passes are the engine's (TrainerEngine.fill_policy_inputs).

    old_log_probs   no-grad forward of the policy (not with --use-rollout-logprobs; skipped when
                    the rollout makes one optimizer step and nothing else needs them: the loss
                    then uses the current log-probs detached, the same values)
    ref_log_probs   no-grad forward of the reference (--use-kl-loss, or --kl-coef shaping)
    advantages      the token part of the run's estimator (loss/returns.py): reinforce_plus_plus(_baseline)
                    add the KL penalty (and returns); with --normalize-advantages every estimator's
                    values are whitened over the whole batch; otherwise the coordinator's values stay

Log-probs use the rollout temperature, like the engine's. Values are stored per response token
in each SequenceItem's extras, and the names are added to every step's extra_names so that
build_micro_batch lays them out at target positions like the Sample fields.
"""

from __future__ import annotations

import torch

from rollway.trainer.config import TOKEN_LEVEL_ESTIMATORS, TrainerConfig
from rollway.trainer.loss.kl import approx_kl
from rollway.trainer.loss.returns import reinforce_plus_plus_baseline, reinforce_plus_plus_returns, whiten
from rollway.trainer.micro_batch import SequenceItem


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


def log_prob_inputs(settings: TrainerConfig, num_steps: int) -> list[str]:
    """The log-probs the engine computes before the first update: old_log_probs, ref_log_probs."""
    names = []
    if needs_old_pass(settings, num_steps):
        names.append("old_log_probs")
    if needs_reference(settings):
        names.append("ref_log_probs")
    return names


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


def complete_policy_inputs(steps: list, settings: TrainerConfig, names: list[str], distributed: bool) -> None:
    """Every rank, once the engine filled `names` (log_prob_inputs) into its items' extras: name
    them among every step's per-token inputs, and complete the advantages (module doc). With
    --normalize-advantages this is a collective: every rank calls it."""
    for step in steps:
        step.extra_names = tuple(sorted({*step.extra_names, *names}))
    if completes_advantages(settings):
        items = [item for step in steps for mb in step.micro_batches for item in mb]
        _token_level_advantages(items, settings, distributed)
