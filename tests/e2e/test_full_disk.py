"""A full disk under the checkpoints (a real ENOSPC: a small tmpfs) and under the run directory."""

from __future__ import annotations

import errno
import json
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.small_disk import MIB, small_disk
from support.stack import coordinator_stub, sft_service_args, start_run, start_services, wait_run

from rollway.coordinator.v1 import coordinator_pb2


def partial_saves(save: Path) -> list[Path]:
    return sorted(save.rglob(".tmp-iter_*"))


@pytest.fixture(scope="module")
def services(tmp_path_factory, tiny_model_dir, demo_data_dir):
    """One set of SFT services for every run of this file (each run its own id), as users share
    them: a run that fails on a full disk leaves them ready for the next."""
    workdir = tmp_path_factory.mktemp("full-disk")
    with ExitStack() as stack:
        yield start_services(stack, workdir, sft_service_args(tiny_model_dir, demo_data_dir))


def sft_config(services, **config) -> dict:
    return {
        "loss_type": "sft_loss",
        "rollout_batch_size": 16,
        "global_batch_size": 16,
        "dataloader_addr": services["dataloader"].address,
        "trainer_addr": services["trainer"].address,
        "num_rollout": 4,
        "save_interval": 1,
        **config,
    }


def sft_run(services, name, **config) -> tuple[coordinator_pb2.RunInfo, float, dict, Path]:
    """One SFT run; (final info, seconds from StartRun to its end, this run's service log lines,
    its run directory)."""
    before = {n: s.log_text() for n, s in services.items()}
    stub = coordinator_stub(services["coordinator"])
    started = time.monotonic()
    start_run(stub, name, sft_config(services, **config))
    final = wait_run(stub, name)
    elapsed = time.monotonic() - started
    logs = {n: s.log_text()[len(before[n]) :] for n, s in services.items()}
    return final, elapsed, logs, services["coordinator"].workdir / "runs" / name


# async_save: the write that fails is the trainer's background one, reported at the next finish.
WRITES = pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "async_save"])


@WRITES
def test_a_full_checkpoint_disk_fails_the_run_at_once_naming_it(services, tmp_path, async_save):
    with small_disk(tmp_path / "disk", 6 * MIB) as disk:  # a tiny-model checkpoint is ~12 MiB
        save = disk / "save"
        crashed = save / "rollout_0000009" / "trainer" / ".tmp-iter_0000009-0badc0de"  # an earlier crash
        crashed.mkdir(parents=True)
        (crashed / "shard").write_bytes(b"\0" * MIB)
        final, elapsed, logs, run_dir = sft_run(
            services, f"full-{async_save}", save=str(save), async_save=async_save
        )
        assert final.state == coordinator_pb2.RUN_STATE_FAILED
        assert "No space left on device" in final.error and "ENOSPC" in final.error, final.error
        assert str(save / "rollout_0000001" / "trainer") in final.error
        assert "DEADLINE_EXCEEDED" not in final.error
        assert partial_saves(save) == []  # the failed save's and the crash's partial directories
        assert "checkpoint write failed" in logs["trainer"]
        assert not (save / "rollout_0000001" / "coordinator.json").exists()
        status = json.loads((run_dir / "status.json").read_text())
        assert (status["state"], status["error"]) == ("FAILED", final.error)
        print(f"full checkpoint disk: run failed {elapsed:.1f} s after StartRun")
        assert elapsed < 30.0  # today: 60 s, the coordinator's deadline on SaveCheckpoint


@WRITES
def test_continue_on_checkpoint_error_keeps_training_and_retries_the_next_save(
    services, tmp_path, async_save
):
    with small_disk(tmp_path / "disk", 20 * MIB) as disk:  # room for one checkpoint, not two
        save = disk / "save"
        final, _, logs, run_dir = sft_run(
            services,
            f"continue-{async_save}",
            save=str(save),
            on_checkpoint_error="continue",
            async_save=async_save,
        )
        assert final.state == coordinator_pb2.RUN_STATE_SUCCEEDED, final.error
        assert (save / "rollout_0000001" / "coordinator.json").exists()  # the first save fit
        assert partial_saves(save) == []
        failed = [
            line for line in logs["coordinator"].splitlines() if "checkpoint failed, training on" in line
        ]
        assert len(failed) == 3, failed  # rollouts 2, 3 and 4 were each tried, and failed
        assert "ENOSPC" in failed[0]
        # Before the second save the trainer saw less free space than the first one took.
        assert "less free space than the last checkpoint took" in logs["trainer"]
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        metrics = [json.loads(line) for line in lines]
        assert [m["step"] for m in metrics] == [0, 1, 2, 3]
        # Only the first checkpoint was written: its size is reported with its step, or, written
        # in the background, with the next step (where it was finished); failed writes report none.
        sized = [m["step"] for m in metrics if "checkpoint/bytes" in m]
        assert sized == ([1] if async_save else [0])


def test_status_json_is_written_when_the_run_dir_disk_is_full(services, tmp_path):
    with small_disk(tmp_path / "disk", 64 * 1024) as disk:
        runs = disk / "runs"
        stub = coordinator_stub(services["coordinator"])
        config = sft_config(services, num_rollout=400, run_dir=str(runs))
        del config["save_interval"]  # no checkpoints: the run directory's disk is the one that fills
        start_run(stub, "filled", config)
        try:  # fill what is left (the run may have filled it already) while the run writes
            with open(disk / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        final = wait_run(stub, "filled")
        assert final.state == coordinator_pb2.RUN_STATE_FAILED
        assert "No space left on device" in final.error
        status = json.loads((runs / "filled" / "status.json").read_text())
        assert (status["state"], status["error"]) == ("FAILED", final.error)
