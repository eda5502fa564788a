"""Rollout corrections: the policy loss of tokens the rollout engine sampled with a slightly
different policy than the trainer's, weighted or masked by the train/rollout ratio.

    r_t = exp(train_logp_t - rollout_logp_t)           per token (train: the trainer's old policy)

    --use-tis, tis_mode truncate (Miles' TIS)  w_t = clamp(r_t, tis_clip_low, tis_clip)
    --use-tis, tis_mode icepop   (IcePop)      w_t = r_t inside [tis_clip_low, tis_clip], else 0
    --use-mis, mis_level token   (MIS)         w_t = r_t inside [mis_low, mis_high], else 0
    --use-mis, mis_level sequence              R = prod_t r_t over the sample's loss tokens;
                                               w_t = R inside [mis_low, mis_high], else 0 (whole sample)
    --use-geo-mask (SkyRL's geometric mask)    G = exp(mean_t log r_t); every token of the sample
                                               gets 0 outside [geo_mask_low, geo_mask_high], else 1

The pg loss is multiplied by the product of the weights that are on (TIS or MIS, and the
geometric mask); a masked token keeps its place in the loss's denominators (as Miles' IcePop).
Bounds are compared in log space, so a sequence ratio that overflows float32 is still masked
correctly. A NaN log-ratio is outside every band: its token (its sample, for sequence-level
corrections) gets weight 0, as in Miles' and verl's IcePop and as low_var_kl's NaN rule; -inf and
+inf are simply below and above (TIS: clamped). Metric values that are not finite count as 0 (as
Miles does for its mismatch metrics); policy_loss counts those tokens in num_non_finite_tokens. Metrics (train/<name>, aggregated like the loss; *_min/*_max over all loss tokens):
tis (mean r), tis_min, tis_max, tis_clipfrac (tokens whose weight differs from r: clipped or
masked); mis_ratio (r or R), mis_ratio_min, mis_ratio_max, mis_masked_frac, mis_below_frac,
mis_above_frac; geo_mask_ratio (G), geo_mask_ratio_min, geo_mask_ratio_max,
geo_mask_masked_frac, geo_mask_below_frac, geo_mask_above_frac.
"""

from __future__ import annotations

import math

import torch

from rollway.trainer.config import TrainerConfig

LOG_RATIO_CLAMP = 20.0


def _log(bound: float) -> float:
    return math.log(bound) if bound > 0 else -math.inf


def per_sample_totals(values: torch.Tensor, loss_mask: torch.Tensor, sample_index: torch.Tensor) -> tuple:
    """(sum of `values` over each position's sample's loss tokens, that sample's loss-token count),
    each broadcast to every position. A sample lies inside one micro-batch, so both are exact."""
    valid = sample_index >= 0
    index = torch.where(valid, sample_index, 0).reshape(-1)
    size = int(index.max()) + 1 if index.numel() else 1
    weights = (loss_mask * valid).reshape(-1).to(values.dtype)
    zeros = torch.zeros(size, dtype=values.dtype, device=values.device)
    sums = zeros.scatter_add(0, index, values.reshape(-1) * weights)
    counts = zeros.scatter_add(0, index, weights)
    return sums[index].reshape(values.shape), counts[index].reshape(values.shape)


def _band(
    log_ratio: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(below, above, outside) indicators of exp(log_ratio) against [low, high], decided in log
    space; outside also holds NaN, which is neither below nor above."""
    below, above = log_ratio < _log(low), log_ratio > _log(high)
    return below.float(), above.float(), (below | above | torch.isnan(log_ratio)).float()


def _finite_metrics(metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0) for name, v in metrics.items()}


def truncated_importance_weights(
    log_ratio: torch.Tensor, low: float, high: float, mode: str
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TIS (truncate) or IcePop (icepop) token weights and their metrics."""
    ratio = torch.exp(log_ratio)
    if mode == "truncate":
        # Miles' clamp keeps NaN, which would make the whole loss NaN: weight 0 instead.
        weights = torch.where(torch.isnan(ratio), torch.zeros_like(ratio), ratio.clamp(min=low, max=high))
    elif mode == "icepop":
        _, _, outside = _band(log_ratio, low, high)
        weights = torch.where(outside > 0, torch.zeros_like(ratio), ratio)
    else:
        raise ValueError(f"tis_mode: unknown {mode!r}, expected truncate or icepop")
    metrics = {"tis": ratio, "tis_min": ratio, "tis_max": ratio, "tis_clipfrac": (weights != ratio).float()}
    return weights, _finite_metrics(metrics)


def masked_importance_weights(
    log_ratio: torch.Tensor,
    loss_mask: torch.Tensor,
    sample_index: torch.Tensor,
    level: str,
    low: float,
    high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MIS weights: the token (or whole-sample) ratio inside [low, high], 0 outside."""
    if level == "sequence":
        log_ratio, _ = per_sample_totals(log_ratio, loss_mask, sample_index)
    elif level != "token":
        raise ValueError(f"mis_level: unknown {level!r}, expected token or sequence")
    below, above, masked = _band(log_ratio, low, high)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weights = torch.where(masked > 0, torch.zeros_like(ratio), ratio)
    metrics = {
        "mis_ratio": ratio,
        "mis_ratio_min": ratio,
        "mis_ratio_max": ratio,
        "mis_masked_frac": masked,
        "mis_below_frac": below,
        "mis_above_frac": above,
    }
    return weights, _finite_metrics(metrics)


def geometric_mean_mask(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, sample_index: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """1 for the tokens of samples whose geometric-mean ratio is inside [low, high], else 0."""
    sums, counts = per_sample_totals(log_ratio, loss_mask, sample_index)
    log_geo = sums / counts.clamp(min=1.0)
    below, above, masked = _band(log_geo, low, high)
    geo = torch.exp(log_geo)
    metrics = {
        "geo_mask_ratio": geo,
        "geo_mask_ratio_min": geo,
        "geo_mask_ratio_max": geo,
        "geo_mask_masked_frac": masked,
        "geo_mask_below_frac": below,
        "geo_mask_above_frac": above,
    }
    return 1.0 - masked, _finite_metrics(metrics)


def rollout_correction(
    train_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    sample_index: torch.Tensor,
    settings: TrainerConfig,
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The per-token weight of the pg loss (None when no correction is on) and the metrics."""
    log_ratio = train_log_probs.float() - rollout_log_probs.float()
    s = settings
    weight, metrics = None, {}
    if s.use_tis:
        weight, metrics = truncated_importance_weights(log_ratio, s.tis_clip_low, s.tis_clip, s.tis_mode)
    if s.use_mis:
        weight, metrics = masked_importance_weights(
            log_ratio, loss_mask, sample_index, s.mis_level, s.mis_low, s.mis_high
        )
    if s.use_geo_mask:
        mask, geo_metrics = geometric_mean_mask(
            log_ratio, loss_mask, sample_index, s.geo_mask_low, s.geo_mask_high
        )
        weight = mask if weight is None else weight * mask
        metrics.update(geo_metrics)
    return weight, metrics
