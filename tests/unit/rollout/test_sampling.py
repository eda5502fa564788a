"""Next-token sampling: log-prob definition, greedy, top-k/top-p, per-row seeded generators."""

import torch

from rollway.rollout.sampling import SamplingParams, make_generator, sample_tokens


def _logits(rows: int = 3, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_log_probs_are_fp32_log_softmax_of_logits_over_temperature():
    logits = _logits().to(torch.bfloat16)
    params = [SamplingParams(temperature=t, seed=1) for t in (0.5, 1.0, 2.0)]
    tokens, log_probs = sample_tokens(logits, params, [make_generator(1) for _ in params])
    for row, temperature in enumerate((0.5, 1.0, 2.0)):
        expected = torch.log_softmax(logits[row].float() / temperature, dim=-1)[tokens[row]]
        assert log_probs[row].dtype == torch.float32
        torch.testing.assert_close(log_probs[row], expected, rtol=0, atol=1e-6)


def test_greedy_takes_argmax_and_reports_temperature_one_log_probs():
    logits = _logits()
    tokens, log_probs = sample_tokens(logits, [SamplingParams(temperature=0.0)] * 3, [None] * 3)
    assert tokens.tolist() == logits.argmax(-1).tolist()
    torch.testing.assert_close(log_probs, torch.log_softmax(logits, -1).max(-1).values)


def test_top_k_one_and_tiny_top_p_draw_the_most_likely_token():
    logits = _logits(rows=2)
    params = [SamplingParams(top_k=1, seed=3), SamplingParams(top_p=1e-6, seed=4)]
    for _ in range(20):
        tokens, _ = sample_tokens(logits, params, [make_generator(None), make_generator(None)])
        assert tokens.tolist() == logits.argmax(-1).tolist()


def test_top_p_never_draws_outside_the_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    params = [SamplingParams(top_p=0.7)]  # nucleus: the first two tokens (0.5 < 0.7 <= 0.8)
    generator = make_generator(0)
    drawn = {int(sample_tokens(probs.log(), params, [generator])[0]) for _ in range(300)}
    assert drawn == {0, 1}


def test_sampling_follows_the_distribution():
    probs = torch.tensor([[0.6, 0.3, 0.1]])
    generator = make_generator(123)
    counts = torch.zeros(3)
    for _ in range(3000):
        counts[sample_tokens(probs.log(), [SamplingParams()], [generator])[0]] += 1
    torch.testing.assert_close(counts / counts.sum(), probs[0], atol=0.03, rtol=0)


def test_a_seeded_row_draws_the_same_tokens_whatever_shares_its_batch():
    logits = _logits(rows=4, seed=7)
    alone, together = make_generator(42), make_generator(42)
    others = [make_generator(s) for s in (1, 2, 3)]
    for _ in range(30):
        single, _ = sample_tokens(logits[2:3], [SamplingParams(seed=42)], [alone])
        batch, _ = sample_tokens(
            logits,
            [SamplingParams(seed=s) for s in (1, 2, 42, 3)],
            [others[0], others[1], together, others[2]],
        )
        assert int(single[0]) == int(batch[2])
