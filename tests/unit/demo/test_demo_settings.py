"""The shipped demo (`rollway demo`, make run): its settings are valid runs and are what docs/demo.md says.

The figures docs/demo.md quotes are measured by `make bench` (bench/bench_demo.py) for these settings;
this test pins the settings and the page's statement of them to each other, so that neither
changes without the other.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollway.coordinator.run_config import parse_run_config
from rollway.demo import addition as demo
from rollway.demo.data import make_demo_data
from rollway.demo.dev_set import DEV_ROWS, dev_accuracy

DEMO_PAGE = Path(__file__).resolve().parents[3] / "docs" / "demo.md"


def _demo_section() -> str:
    text = DEMO_PAGE.read_text()
    start = text.index("The demo (`rollway demo`)")
    return text[start : text.index("\n## ", start)]


def _configs(tmp_path: Path, model_dir: Path) -> tuple[dict, dict]:
    data = tmp_path / "data"
    sft = demo.sft_config(tmp_path, model_dir, data, demo.SFT_CHUNK, seed=0)
    grpo = demo.grpo_config(tmp_path, model_dir, data, demo.RL_STEPS, seed=0)
    return sft, grpo


def test_readme_states_the_shipped_settings(tmp_path, tiny_model_dir):
    sft, grpo = _configs(tmp_path, tiny_model_dir)
    section = " ".join(_demo_section().split())
    stated = re.search(
        r"SFT \((\d+) conversations a step, lr ([0-9.e-]+) after (\d+) warmup steps, in chunks of (\d+) "
        r"steps until the greedy accuracy on (\d+) dev sums first reaches ([0-9.]+), at most (\d+) steps\)",
        section,
    )
    assert stated, "docs/demo.md's demo section no longer states the SFT settings"
    assert (int(stated[1]), float(stated[2]), int(stated[3]), int(stated[4])) == (
        sft["global_batch_size"],
        sft["lr"],
        sft["lr_warmup_iters"],
        demo.SFT_CHUNK,
    )
    assert (int(stated[5]), float(stated[6]), int(stated[7])) == (
        DEV_ROWS,
        demo.SFT_STOP_DEV_ACCURACY,
        demo.SFT_MAX_STEPS,
    )
    stated = re.search(
        r"GRPO \((\d+) rollouts of (\d+) prompts x (\d+) samples, lr ([0-9.e-]+), Adam beta2 ([0-9.]+), "
        r"temperature ([0-9.]+), reward (\w+); the lr decays to 0 by a (\w+) over the run\)",
        section,
    )
    assert stated, "docs/demo.md's demo section no longer states the GRPO settings"
    assert stated.groups() == (
        str(grpo["num_rollout"]),
        str(grpo["rollout_batch_size"]),
        str(grpo["n_samples_per_prompt"]),
        stated[4],
        stated[5],
        stated[6],
        grpo["rm_type"],
        grpo["lr_decay_style"],
    )
    assert grpo["lr_decay_iters"] == grpo["num_rollout"] and "min_lr" not in grpo  # to 0 at the end
    assert (float(stated[4]), float(stated[5]), float(stated[6])) == (
        grpo["lr"],
        grpo["adam_beta2"],
        grpo["rollout_temperature"],
    )
    # One optimizer step per rollout: every sample of a rollout in one global batch.
    assert grpo["global_batch_size"] == grpo["rollout_batch_size"] * grpo["n_samples_per_prompt"]


def test_readme_figures_are_for_seeds_0_1_2_and_add_up():
    rows = re.findall(r"^\| (\d) \| ([0-9.]+) \| ([0-9.]+) \| \+([0-9.]+) \|", _demo_section(), re.M)
    assert [int(seed) for seed, *_ in rows] == [0, 1, 2]
    for _, before, after, lift in rows:
        assert abs(float(after) - float(before) - float(lift)) < 1e-9
        assert 0.0 <= float(before) <= 1.0 and 0.0 <= float(after) <= 1.0


def test_the_shipped_configs_are_valid_runs(tmp_path, tiny_model_dir):
    sft, grpo = _configs(tmp_path, tiny_model_dir)
    sft_run = parse_run_config(sft)
    assert sft_run.trainer.loss_type == "sft_loss" and sft_run.coordinator.num_rollout == demo.SFT_CHUNK
    # Each chunk ends with a checkpoint, from which the next chunk resumes.
    assert sft_run.coordinator.save == sft["save"] and sft_run.coordinator.save_interval == 0
    grpo_run = parse_run_config(grpo)
    assert grpo_run.coordinator.num_rollout == demo.RL_STEPS
    assert grpo_run.trainer.lr == demo.RL_LR and grpo_run.trainer.adam_beta2 == demo.RL_ADAM_BETA2
    assert grpo_run.coordinator.eval_temperature == 0.0  # held-out accuracy is greedy


def test_demo_task_addition_reaches_the_addition_demo(capsys):
    """`rollway demo --task addition` is the default demo (the --task word is not passed on to it)."""
    from rollway.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["demo", "--task", "addition", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--sft-steps" in out and "--task" in out


def test_the_dev_split_is_not_the_reported_eval_split(tmp_path, tiny_model_dir):
    """SFT stops on the first DEV_ROWS RL prompts: none of them (in either order) is a held-out sum."""
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    make_demo_data(data, seed=0)
    dev = pq.read_table(data / "rl.parquet", columns=["metadata"]).slice(0, DEV_ROWS).to_pylist()
    held_out = pq.read_table(data / "eval.parquet", columns=["metadata"]).to_pylist()
    dev_pairs = {frozenset((r["metadata"]["a"], r["metadata"]["b"])) for r in dev}
    assert len(dev) == DEV_ROWS
    assert not dev_pairs & {frozenset((r["metadata"]["a"], r["metadata"]["b"])) for r in held_out}
    # The untrained tiny model adds no sum right; the rule scores it 0.
    assert dev_accuracy(tiny_model_dir, data / "rl.parquet", rows=8) == 0.0
