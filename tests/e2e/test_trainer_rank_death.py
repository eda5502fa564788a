"""A 2-rank trainer heals in-run: kill -9 of rank 1 (by pid) mid-run under `rollway run` ends the
trainer (exit_when_ranks_break, set by the coordinator's launcher), the coordinator restarts it with
both ranks, and the run goes on from its last checkpoint: each step logged once, one restart, final
weights bit-identical to the uninterrupted run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollway.deploy.chaos import Kill, run_with_chaos

pytestmark = pytest.mark.slow

NUM_STEPS = 5
RUN_SECONDS = 300.0
RANK_1 = "trainer.worker"  # python -m rollway.trainer.worker: ranks 1.. of the trainer (rank 1 here)


def sft_run(tmp_path: Path, name: str, model: Path, data: Path, schedule=()):
    workdir = tmp_path / name
    workdir.mkdir()
    config = {
        "run_id": name,
        "run_dir": str(workdir / "runs"),
        "hf_checkpoint": str(model),
        "loss_type": "sft_loss",
        "prompt_data": [str(data / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "num_rollout": NUM_STEPS,
        "rollout_batch_size": 8,
        "global_batch_size": 8,
        "lr": 3e-3,
        "world_size": 2,
        "dtype": "float32",
        "save": str(workdir / "save"),
        "save_interval": 1,
        "save_hf": str(workdir / "hf"),
        "max_restarts": 2,
        "restart_backoff_seconds": 0.1,
    }
    path = workdir / "run.json"
    path.write_text(json.dumps(config))  # JSON is YAML
    run_dir = workdir / "runs" / name
    run = run_with_chaos(
        path, run_dir, list(schedule), seed=3, log_path=workdir / "launcher.log", timeout_seconds=RUN_SECONDS
    )
    assert run.returncode == 0, (workdir / "launcher.log").read_text()[-3000:]
    assert run.error is None, run.error
    return run, run_dir


def test_kill_9_of_trainer_rank_1_rebuilds_the_trainer_and_the_run_ends_as_if_uninterrupted(
    tmp_path, tiny_model_dir, demo_data_dir
):
    _, straight_dir = sft_run(tmp_path, "straight", tiny_model_dir, demo_data_dir)
    run, healed_dir = sft_run(tmp_path, "healed", tiny_model_dir, demo_data_dir, [Kill(2, RANK_1)])

    # Rank 1 was killed once, and a new rank 1 (of a new trainer) ran a step after it.
    (kill,) = run.kills
    assert kill.service == RANK_1 and kill.next_step_seconds is not None, run.kills
    result = json.loads((healed_dir / "result.json").read_text())
    assert result["num_restarts"] == 1
    (recovery,) = result["recoveries"]
    assert recovery["service"] == "trainer" and "exited with 75 (its ranks broke" in recovery["cause"], (
        recovery
    )

    # Each step once, with the uninterrupted run's losses, and the final weights bit for bit.
    records = [json.loads(line) for line in (healed_dir / "metrics.jsonl").read_text().splitlines()]
    straight = [json.loads(line) for line in (straight_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [r["step"] for r in straight] == list(range(NUM_STEPS))
    assert [r["sft/loss"] for r in records] == [r["sft/loss"] for r in straight]
    assert records[-1]["fault/num_restarts"] == 1
    exports = [
        Path(json.loads((d / "result.json").read_text())["hf_export_dir"]) for d in (healed_dir, straight_dir)
    ]
    assert exports[0] != exports[1]
    assert (exports[0] / "model.safetensors").read_bytes() == (exports[1] / "model.safetensors").read_bytes()
