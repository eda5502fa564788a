"""Chunked fp32 log-probs and entropy."""

from __future__ import annotations

import torch

from rollway.trainer.log_probs import response_values, token_log_probs


def test_chunked_log_probs_match_a_direct_log_softmax_with_temperature():
    torch.manual_seed(0)
    logits = torch.randn(1, 37, 50, dtype=torch.bfloat16)
    targets = torch.randint(0, 50, (1, 37))
    logp, entropy = token_log_probs(logits, targets, temperature=0.7, chunk_size=8, with_entropy=True)
    reference = torch.log_softmax(logits.float() / 0.7, -1)
    torch.testing.assert_close(logp, reference.gather(-1, targets[..., None])[..., 0])
    torch.testing.assert_close(entropy, -(reference.exp() * reference).sum(-1))
    assert logp.dtype == torch.float32 and logp.shape == (1, 37)


def test_response_values_slice_spans():
    values = torch.arange(10.0).reshape(1, 10)
    assert response_values(values, [(5, 0, 2, 5), (6, 0, 7, 9)]) == {5: [2.0, 3.0, 4.0], 6: [7.0, 8.0]}
