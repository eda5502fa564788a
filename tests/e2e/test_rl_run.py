"""GRPO runs end to end over the real services: sync, async, and dump/replay of rollouts.

Every run of this file goes to one set of long-lived services, as a user's runs do: each run has
its own run id and run directory, and its Init resets what the services keep (the rollout engine
to the base weights at version 0, the trainer's model and optimizer), so the runs are independent
of their order. Settings that differ per run (max_running_requests) are the run's, not the
services' start-up flags."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from support.jsonl import read_metrics
from support.rl_stack import rl_config, start_rl_stack
from support.stack import coordinator_stub, start_run, wait_run

from rollway.coordinator import run_state
from rollway.coordinator.v1 import coordinator_pb2

SUCCEEDED = coordinator_pb2.RUN_STATE_SUCCEEDED


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_dir, demo_data_dir):
    """The four services every run of this file goes to, and where their runs are written."""
    workdir = tmp_path_factory.mktemp("rl-run")
    with ExitStack() as services_stack:
        services = start_rl_stack(services_stack, workdir, tiny_model_dir, demo_data_dir)
        yield services, workdir / "runs"


def run_rl(stack, name: str, *, without: tuple[str, ...] = (), **extra) -> list[dict]:
    """One run to its end on the shared services (less the `without` addresses); its metrics."""
    services, runs_root = stack
    config = rl_config(services, **extra)
    for address in without:
        del config[address]
    stub = coordinator_stub(services["coordinator"])
    start_run(stub, name, config)
    final = wait_run(stub, name)
    assert final.state == SUCCEEDED, final.error
    return read_metrics(runs_root / name)


def test_sync_grpo_syncs_weights_every_step_and_versions_move_forward(stack):
    metrics = run_rl(stack, "sync")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # Version 1 is pushed before the first rollout; every step trains, then pushes the next version.
    assert [m["rollout/weight_version/min"] for m in metrics] == [1.0, 2.0, 3.0]
    assert [m["rollout/weight_version"] for m in metrics] == [2.0, 3.0, 4.0]
    assert all(m["rollout/staleness/max"] == 0.0 for m in metrics)
    assert all(m["perf/weight_sync_time"] > 0 for m in metrics)
    assert all(m["rollout/num_samples"] == 16.0 for m in metrics)
    assert any(0.0 < m["rollout/raw_reward"] < 1.0 for m in metrics)
    assert all(m["train/grad_norm"] > 0 for m in metrics)


def test_async_grpo_overlaps_generation_with_bounded_staleness(stack):
    metrics = run_rl(
        stack,
        "async",
        num_rollout=4,
        async_mode=True,
        max_weight_staleness=1,
    )
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    versions = [m["rollout/weight_version/min"] for m in metrics]
    assert versions == sorted(versions) and versions[0] == 1.0
    # Rollout k+1 is generated while rollout k trains: with the weights of k, one version behind.
    assert [m["rollout/staleness/max"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]
    assert [m["rollout/weight_version"] for m in metrics] == [2.0, 3.0, 4.0, 5.0]


def test_async_generates_up_to_max_weight_staleness_rollouts_ahead(stack, tmp_path):
    # With max_weight_staleness 2 the worker generates rollouts k+1 and k+2 while k trains: a
    # rollout is trained up to two versions after the one it was generated with, never more.
    metrics = run_rl(
        stack,
        "async2",
        num_rollout=5,
        async_mode=True,
        max_weight_staleness=2,
        rollout_max_response_len=2,
        save=str(tmp_path / "save"),
        save_interval=1,
    )
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]
    staleness = [m["rollout/staleness/max"] for m in metrics]
    assert staleness[0] == 0.0 and max(staleness) == 2.0 and all(s <= 2.0 for s in staleness), staleness
    assert [m["rollout/fully_async/max_staleness"] for m in metrics] == staleness  # Miles' name
    # Admission: rollout k never starts on weights older than version k + 1 - 2.
    assert all(m["rollout/weight_version/min"] >= m["step"] - 1 for m in metrics)
    assert [m["rollout/weight_version"] for m in metrics] == [2.0, 3.0, 4.0, 5.0, 6.0]
    # Checkpoint k holds the data position before rollout k + 1, although rollouts up to k + 2 were
    # fetched: one batch of 4 groups per rollout, so a resume neither skips nor repeats prompts.
    for k in range(5):
        state, cursor = run_state.read_checkpoint(run_state.checkpoint_dir(tmp_path / "save", k + 1))
        assert (state.next_rollout_id, state.next_batch_id, state.next_group_index) == (
            k + 1,
            k + 1,
            4 * (k + 1),
        )
        assert cursor is not None


def test_async_grpo_with_dynamic_sampling_and_partial_rollout(stack):
    # The whole path with the trainer: filtered refills abort their leftovers, carried groups are
    # continued in the next rollout with their earlier tokens loss-masked, and training goes on.
    # One sample decoded at a time, so a refill that has enough groups always has leftovers.
    metrics = run_rl(
        stack,
        "partial",
        max_running_requests=1,
        n_samples_per_prompt=2,
        global_batch_size=8,
        rollout_max_response_len=16,
        dynamic_sampling_filter_path="check_reward_nonzero_std",
        over_sampling_batch_size=4,
        partial_rollout=True,
        mask_offpolicy_in_partial_rollout=True,
        async_mode=True,
    )
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all(m["rollout/num_samples"] == 8.0 and m["rollout/raw_reward"] == 0.5 for m in metrics)
    carried = [m["rollout/partial/carried_groups"] for m in metrics]
    continued = [m["rollout/partial/continued_samples"] for m in metrics]
    assert continued[0] == 0.0 and sum(carried[:-1]) > 0
    assert all((continued[k + 1] > 0) == (carried[k] > 0) for k in range(len(metrics) - 1))
    assert all(m["train/grad_norm"] > 0 for m in metrics)
    assert [m["rollout/weight_version"] for m in metrics] == [2.0, 3.0, 4.0]


def test_dumped_rollouts_replay_to_the_same_losses(stack, tmp_path):
    dump = str(tmp_path / "dump" / "rollout_{rollout_id}.pb")
    original = run_rl(stack, "original", save_debug_rollout_data=dump)
    # The replay trains on the dumped rollouts alone: no rollout service.
    replayed = run_rl(stack, "replay", without=("rollout_addr",), load_debug_rollout_data=dump)
    assert len(replayed) == len(original) == 3
    for key in ("train/loss", "train/pg_loss", "train/grad_norm", "rollout/raw_reward"):
        assert [m[key] for m in replayed] == pytest.approx([m[key] for m in original], rel=1e-5, abs=1e-7), (
            key
        )
    assert all(m["train/grad_norm"] > 0 for m in original)


def test_rollout_only_with_dynamic_sampling_refills_dropped_groups(stack):
    metrics = run_rl(  # --debug-rollout-only needs no trainer
        stack,
        "ds",
        without=("trainer_addr",),
        debug_rollout_only=True,
        n_samples_per_prompt=2,
        global_batch_size=8,
        dynamic_sampling_filter_path="check_reward_nonzero_std",
        over_sampling_batch_size=4,
    )
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # Groups of two with equal rewards carry no signal: dropped, and refilled up to 4 groups.
    assert all(m["rollout/num_samples"] == 8.0 for m in metrics)
    assert sum(m["rollout/zero_std/dropped_groups"] for m in metrics) > 0
    assert all(m["rollout/raw_reward"] == 0.5 for m in metrics)  # every kept group has one 1 and one 0
    assert all(m["rollout/weight_version/min"] == 0.0 for m in metrics)  # nothing was ever pushed
    assert "train/loss" not in metrics[0]
