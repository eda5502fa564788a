"""Learning-rate schedules."""

from __future__ import annotations

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
