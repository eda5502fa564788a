"""Next-token sampling with per-row seeds, and the log-probs the trainer recomputes.

Log-probs follow Miles and the trainer exactly: logits cast to fp32, divided by the row's
temperature, log-softmax over the whole vocabulary; the log-prob reported is that of the
sampled token. top-k / top-p only restrict which tokens may be drawn; they do not renormalise
the reported log-probs (the trainer cannot know them). Temperature 0 is greedy decoding, and
its log-probs are defined at temperature 1.

Each seeded row owns a torch.Generator and draws exactly one uniform number per token, so its
samples do not depend on which other rows share the batch (continuous batching changes the
batch at every step).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one sample, with the service defaults already applied."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 1024
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    stop: tuple[str, ...] = ()
    seed: int | None = None  # the per-sample seed (request seed + sample index), or None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with `seed`, or from the OS when unseeded."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed if seed is not None else random.SystemRandom().getrandbits(63))
    return generator


def _top_k_top_p_mask(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Boolean [B, V] mask of tokens excluded by per-row top-k (<=0: off) and top-p (1: off)."""
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(scaled.shape[-1], device=scaled.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k, scaled.shape[-1]).unsqueeze(-1)
    drop_sorted = ranks >= k
    probs = sorted_logits.masked_fill(drop_sorted, float("-inf")).softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token once the mass before it does.
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted |= mass_before >= top_p.unsqueeze(-1)
    drop_sorted[:, 0] = False
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def sample_tokens(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of `logits` [B, V]; return (tokens [B], their log-probs [B] fp32)."""
    logits = logits.float()
    device = logits.device
    temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=device)
    scaled = logits / temperature.unsqueeze(-1)
    log_probs = torch.log_softmax(scaled, dim=-1)
    tokens = logits.argmax(dim=-1)
    sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
    if sampled_rows:
        rows = torch.tensor(sampled_rows, device=device)
        row_logits = scaled[rows]
        top_k = torch.tensor([params[i].top_k for i in sampled_rows], device=device)
        top_p = torch.tensor([params[i].top_p for i in sampled_rows], dtype=torch.float32, device=device)
        if bool((top_k > 0).any() or (top_p < 1).any()):
            row_logits = row_logits.masked_fill(_top_k_top_p_mask(row_logits, top_k, top_p), float("-inf"))
        probs = row_logits.softmax(dim=-1)
        # Inverse-CDF sampling: one uniform per row from that row's own generator.
        uniforms = torch.stack([torch.rand((), generator=generators[i]) for i in sampled_rows]).to(device)
        cdf = probs.cumsum(dim=-1)
        targets = (uniforms * cdf[:, -1]).unsqueeze(-1)
        drawn = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
        drawn = drawn.clamp(max=probs.shape[-1] - 1)
        # Never draw a token of zero probability (rounding at the end of the CDF).
        drawn = torch.where(probs.gather(-1, drawn.unsqueeze(-1)).squeeze(-1) > 0, drawn, probs.argmax(-1))
        tokens[rows] = drawn
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
