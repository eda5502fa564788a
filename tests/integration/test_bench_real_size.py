"""bench/bench_real_size.py --quick records every figure of issue #26's bench, and each is sane.

The quick bench runs SFT and GRPO on the small preset (~50.6M parameters) under `rollway run`,
with a checkpoint every step and one kill -9 of the trainer per run, 2 steps each (two launches:
about a minute on the shared 2-core machine). Its figures are checked against what the model's
size fixes: a run checkpoint holds
at least the fp32 weights and AdamW's two moments, the trainer holds at least weights, gradients
and moments, and one weight push sends every parameter once in fp32 (tied embeddings once).
"""

from __future__ import annotations

import pytest

from bench import bench_real_size

pytestmark = pytest.mark.slow


def test_the_quick_real_size_bench_records_every_figure_and_each_is_sane():
    result = bench_real_size.run(quick=True)
    num_parameters = result.summary["num_parameters"]
    assert 45e6 < num_parameters < 55e6  # the small preset
    sft, grpo = result.rows
    assert (sft["run"], grpo["run"]) == ("sft", "grpo")
    for row in (sft, grpo):
        assert set(row) >= set(result.units), f"{row['run']}: missing {set(result.units) - set(row)}"
        assert row["steps"] == bench_real_size.QUICK.num_steps
        assert row["s_per_step"] > row["step_s"] > 0  # the checkpoint's time is in s/step
        assert row["save_s"] > 0
        assert row["train_tokens_per_s"] > row["tokens_per_s"] > 0
        assert row["tokens_per_step"] > 0
        assert row["grad_norm"] > 0  # the steps trained (a reward that never varies gives 0 in GRPO)
        assert 12 * num_parameters <= row["checkpoint_bytes"] < 24 * num_parameters
        assert row["peak_trainer_gib"] * 2**30 > 16 * num_parameters
        assert row["peak_dataloader_gib"] > 0 and row["peak_coordinator_gib"] > 0
        assert row["startup_s"] > 0 and row["kill_to_next_step_s"] > 0
        assert row["wall_s"] > row["startup_s"] + row["kill_to_next_step_s"]
    assert sft["sync_bytes"] == 0 and sft["sync_gb_s"] == 0  # SFT pushes no weights
    assert grpo["sync_bytes"] == 4 * num_parameters
    assert grpo["sync_gb_s"] > 0
    assert grpo["peak_rollout_gib"] * 2**30 > 4 * num_parameters  # the engine's fp32 weights
