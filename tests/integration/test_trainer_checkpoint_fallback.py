"""LoadCheckpoint on a directory whose latest checkpoint is corrupt: the newest one that verifies is
loaded, the response and the log say which were skipped and why; none verifies: a clear refusal."""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import struct_pb2
from support.processes import ServiceProcess
from support.trainer_steps import train_sft_step

from rollway.coordinator.remote import Services
from rollway.trainer.v1 import trainer_pb2 as pb


def checksum(services: Services) -> str:
    return services.trainer.WeightChecksum(pb.WeightChecksumRequest(dtype="float32")).checksum.digest


def test_a_corrupt_latest_checkpoint_falls_back_to_the_newest_verified_one(tiny_model_dir, tmp_path):
    args = ["--hf-checkpoint", str(tiny_model_dir), "--dtype", "float32"]
    save = tmp_path / "save"
    with ServiceProcess("trainer", args, tmp_path / "logs") as trainer:
        services = Services.connect(trainer=trainer.address)
        config = struct_pb2.Struct()
        config.update({"lr": 1e-3})
        services.trainer.Init(pb.InitRequest(config=config, run_id="fallback"))
        saved = {}
        for step in (1, 2, 3):
            train_sft_step(services, step)
            reply = services.trainer.SaveCheckpoint(pb.SaveCheckpointRequest(path=str(save)))
            saved[reply.global_step] = (reply.checkpoint_dir, checksum(services))
        assert sorted(saved) == [1, 2, 3]

        shard = sorted((save / "iter_0000003" / "model").glob("*.distcp"))[0]
        shard.write_bytes(shard.read_bytes()[:-64])  # truncated
        meta = save / "iter_0000002" / "meta.json"
        size = meta.stat().st_size
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "global_step": 9}))  # edited
        loaded = services.trainer.LoadCheckpoint(pb.LoadCheckpointRequest(path=str(save)))
        assert (loaded.checkpoint_dir, loaded.global_step) == (saved[1][0], 1)
        assert checksum(services) == saved[1][1]  # the weights of step 1, not 3's
        assert list(loaded.skipped_checkpoints) == [
            f"{shard}: size {shard.stat().st_size} != {shard.stat().st_size + 64} in the manifest",
            f"{meta}: size {meta.stat().st_size} != {size} in the manifest",
        ]
        warnings = [
            json.loads(line) for line in trainer.log_text().splitlines() if "newer checkpoint skipped" in line
        ]
        assert [w["reason"] for w in warnings] == list(loaded.skipped_checkpoints)
        assert all(w["level"] == "warning" and w["loading"] == saved[1][0] for w in warnings)

        (save / "iter_0000001" / "manifest.json").write_text("{")
        with pytest.raises(grpc.RpcError) as info:
            services.trainer.LoadCheckpoint(pb.LoadCheckpointRequest(path=str(save)))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert info.value.details().startswith(
            f"checkpoint refused: {save}: no checkpoint verifies ({shard}: size"
        )
        assert f"{save}/iter_0000001/manifest.json: unreadable manifest" in info.value.details()
        train_sft_step(services, 2)  # still serving: the model of step 1 trains on
        services.close()
