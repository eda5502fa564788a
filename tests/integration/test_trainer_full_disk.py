"""SaveCheckpoint onto a full disk (a real ENOSPC from a small tmpfs), on two trainer ranks: an
answer at once naming the path and errno, not retried, the partial directory removed, the ranks
still in step (the next save elsewhere works), and a warning before a save that will not fit."""

from __future__ import annotations

import json
import time

import grpc
import pytest
from google.protobuf import struct_pb2
from support.processes import ServiceProcess
from support.small_disk import MIB, small_disk
from support.trainer_steps import train_sft_step

from rollway.coordinator.remote import Services
from rollway.trainer.v1 import trainer_pb2 as pb


def test_a_full_disk_is_reported_at_once_and_leaves_the_ranks_in_step(tiny_model_dir, tmp_path):
    args = ["--hf-checkpoint", str(tiny_model_dir), "--world-size", "2", "--dtype", "float32"]
    with (
        small_disk(tmp_path / "disk", 20 * MIB) as disk,
        ServiceProcess("trainer", args, tmp_path / "logs") as trainer,
    ):
        services = Services.connect(trainer=trainer.address)
        config = struct_pb2.Struct()
        config.update({"lr": 1e-3})
        services.trainer.Init(pb.InitRequest(config=config, run_id="full-disk"))
        train_sft_step(services, 1)
        first = services.trainer.SaveCheckpoint(
            pb.SaveCheckpointRequest(path=str(disk / "a"))
        )  # ~12 MiB: fits
        assert first.global_step == 1
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            services.trainer.SaveCheckpoint(pb.SaveCheckpointRequest(path=str(disk / "b")))
        elapsed = time.monotonic() - started
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = info.value.details()
        assert details.startswith(f"checkpoint write failed under {disk / 'b'}: rank ")
        assert "[Errno 28] No space left on device (ENOSPC)" in details
        assert ("grpc-retry-pushback-ms", "-1") in info.value.trailing_metadata()  # a full disk stays full
        assert elapsed < 10.0, elapsed
        assert sorted(p.name for p in (disk / "b").iterdir()) == []  # the partial directory is gone
        log = [json.loads(line) for line in trainer.log_text().splitlines() if line.startswith("{")]
        events = [e["event"] for e in log]
        assert events.count("rpc refused") == 1  # not retried by the client
        warning = next(e for e in log if e["event"] == "less free space than the last checkpoint took")
        assert warning["level"] == "warning" and warning["free_bytes"] < warning["last_checkpoint_bytes"]
        assert events.index("less free space than the last checkpoint took") < events.index(
            "checkpoint write failed"
        )
        # Both ranks met after the failure: they train and save on.
        train_sft_step(services, 2)
        saved = services.trainer.SaveCheckpoint(pb.SaveCheckpointRequest(path=str(tmp_path / "roomy")))
        assert saved.global_step == 2 and (tmp_path / "roomy" / "iter_0000002" / "manifest.json").is_file()
