"""Learning-rate schedules."""

from __future__ import annotations

import copy
import math

import pytest

from rollway.trainer.config import TrainerConfig
from rollway.trainer.optimizer import lr_at


def config(**kw) -> TrainerConfig:
    return TrainerConfig(hf_checkpoint="x", **kw)


def test_constant_with_warmup():
    c = config(lr=1.0, lr_warmup_iters=4)
    assert [lr_at(k, c) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_decay_to_min_lr():
    c = config(lr=1.0, min_lr=0.1, lr_decay_style="linear", lr_warmup_iters=2, lr_decay_iters=12)
    assert lr_at(0, c) == 0.5
    assert lr_at(2, c) == pytest.approx(1.0)
    assert lr_at(7, c) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(12, c) == pytest.approx(0.1)
    assert lr_at(100, c) == pytest.approx(0.1)


def test_cosine_decay():
    c = config(lr=2.0, min_lr=0.0, lr_decay_style="cosine", lr_decay_iters=10)
    assert lr_at(0, c) == pytest.approx(2.0)
    assert lr_at(5, c) == pytest.approx(1.0)
    assert lr_at(3, c) == pytest.approx(1.0 + math.cos(math.pi * 0.3))
    assert lr_at(10, c) == pytest.approx(0.0, abs=1e-12)


def test_the_fused_adamw_and_foreach_clipping_equal_torch_per_parameter_loop():
    import torch

    from rollway.trainer.optimizer import build_optimizer, clip_grad_norm

    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    reference = copy.deepcopy(ours)
    initial = copy.deepcopy(ours)
    settings = config(lr=1e-2, weight_decay=0.1, clip_grad=0.5)
    optimizer = build_optimizer(ours, settings)
    loop = torch.optim.AdamW(
        reference.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1, foreach=False
    )
    for group in optimizer.param_groups:  # the same hyper-parameters as the reference's
        group.update(betas=(0.9, 0.98), eps=1e-8)
    for step in range(4):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
        for model in (ours, reference):
            model(x).pow(2).sum().backward()
        norm = clip_grad_norm(ours, 0.5)
        reference_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5, foreach=False)
        # the same norm (the first step's grads are equal bit for bit); clipping in play
        assert norm == pytest.approx(float(reference_norm), rel=1e-6) and norm > 0.5
        optimizer.step()
        loop.step()
        optimizer.zero_grad()
        loop.zero_grad()
    for mine, theirs in zip(ours.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)  # fused: float32 rounding
    assert not torch.equal(ours[0].weight, initial[0].weight)  # it trained
