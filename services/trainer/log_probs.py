"""Per-token log-probs (and entropy) of target tokens, in fp32, a chunk of positions at a time.

Logits are divided by the temperature (Miles: the rollout temperature) before the log-softmax,
so the trainer's numbers are comparable with the engine's. Only one chunk of fp32 logits
exists at a time (plus what autograd keeps for the backward).
"""

from __future__ import annotations

import torch


def token_log_probs(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    entropy_requires_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) at every position of `logits` [..., V], and optionally the entropy.

    Returns tensors shaped like `target_ids` (fp32). With `entropy_requires_grad` False the
    entropy is a metric only: no graph (and no [chunk, V] tensors) is kept for it.
    """
    shape = target_ids.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_targets = target_ids.reshape(-1)
    log_probs, entropies = [], []
    for start in range(0, flat_targets.shape[0], chunk_size):
        chunk = flat_logits[start : start + chunk_size].float()
        if temperature != 1.0:
            chunk = chunk / temperature
        log_softmax = torch.log_softmax(chunk, dim=-1)
        targets = flat_targets[start : start + chunk_size, None]
        log_probs.append(log_softmax.gather(-1, targets).squeeze(-1))
        if with_entropy:
            with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
                entropies.append(-(log_softmax.exp() * log_softmax).sum(-1))
    log_prob = torch.cat(log_probs).reshape(shape)
    entropy = torch.cat(entropies).reshape(shape) if with_entropy else None
    return log_prob, entropy


def response_values(values: torch.Tensor, spans: list[tuple[int, int, int, int]]) -> dict[int, list[float]]:
    """Per-sample response slices of a [rows, length] tensor: {sample index: values}."""
    host = values.detach().float().cpu()
    return {index: host[row, first:end].tolist() for index, row, first, end in spans}
