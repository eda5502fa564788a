"""async_save through the trainer service, on a 50M-class model, and the Hugging Face export that
writes nothing else.

- kill -9 of the trainer while an async checkpoint is being written (observed: its shards are in
  the temporary directory, no manifest yet; the write is held there, so the kill catches it in
  flight on any machine): a new trainer loads the last complete checkpoint,
  with bit-identical weights, and the write in flight is never taken for a checkpoint;
- ExportHF writes only Hugging Face files, which from_pretrained loads to the trainer's weights.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest
import torch
from google.protobuf import struct_pb2
from safetensors.torch import load_file
from support.processes import ServiceProcess
from support.trainer_steps import train_sft_step
from transformers import AutoModelForCausalLM

from rollway.coordinator.remote import Services
from rollway.demo.tiny_model import make_tiny_model
from rollway.trainer.export import SIDE_FILES
from rollway.trainer.v1 import trainer_pb2 as pb

WAIT_S = 120.0
TESTS_DIR = str(Path(__file__).resolve().parents[1])  # support.held_checkpoint lives there


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("small-model"), seed=0, preset="small")


def start_trainer(model_dir: Path, logs: Path, hold_step: int | None = None) -> ServiceProcess:
    """A trainer; with `hold_step`, its background write of that step never finishes (it is held
    once its shards are written: support/held_checkpoint.py), so a kill always lands mid-write."""
    args = ["--hf-checkpoint", str(model_dir), "--dtype", "float32"]
    if hold_step is None:
        return ServiceProcess("trainer", args, logs)
    env = {"PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])}
    args += ["--hold-step", str(hold_step)]
    return ServiceProcess("trainer", args, logs, module="support.held_checkpoint", env=env)


def init(services: Services, run_id: str) -> None:
    config = struct_pb2.Struct()
    config.update({"lr": 1e-3})
    services.trainer.Init(pb.InitRequest(config=config, run_id=run_id))


def checksum(services: Services) -> str:
    return services.trainer.WeightChecksum(pb.WeightChecksumRequest(dtype="float32")).checksum.digest


def wait_for(condition, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.005)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_kill_9_mid_write_resumes_from_the_last_complete_checkpoint(small_model_dir, tmp_path):
    save = tmp_path / "save"
    with start_trainer(small_model_dir, tmp_path / "logs-1", hold_step=2) as trainer:
        services = Services.connect(trainer=trainer.address)
        init(services, "killed")
        train_sft_step(services, 1)
        first = services.trainer.SaveCheckpoint(pb.SaveCheckpointRequest(path=str(save), async_save=True))
        done = services.trainer.WaitCheckpoint(pb.WaitCheckpointRequest(checkpoint_dir=first.checkpoint_dir))
        assert done.checkpoint_dir == str(save / "iter_0000001") and done.size_bytes > 50_000_000 * 12
        assert done.write_seconds > 0 and (save / "latest_checkpointed_iteration.txt").read_text() == "1"
        complete = checksum(services)
        train_sft_step(services, 2)
        second = services.trainer.SaveCheckpoint(pb.SaveCheckpointRequest(path=str(save), async_save=True))
        assert second.checkpoint_dir == str(save / "iter_0000002")
        # Mid-write: the model's shards are down; the write cannot finish before the kill (held).
        partial = wait_for(
            lambda: sorted(save.glob(".tmp-iter_0000002-*/model/.metadata")), "the model shards"
        )
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.proc.wait(timeout=WAIT_S)
        services.close()
    tmp_dir = partial[0].parent.parent
    assert not (tmp_dir / "manifest.json").exists()  # killed before the write completed
    assert not (save / "iter_0000002").exists()
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "1"

    with start_trainer(small_model_dir, tmp_path / "logs-2") as trainer:
        services = Services.connect(trainer=trainer.address)
        init(services, "resumed")
        loaded = services.trainer.LoadCheckpoint(pb.LoadCheckpointRequest(path=str(save)))
        assert (loaded.checkpoint_dir, loaded.global_step) == (str(save / "iter_0000001"), 1)
        assert list(loaded.skipped_checkpoints) == []
        assert checksum(services) == complete  # bit-identical to the weights of the save
        with pytest.raises(grpc.RpcError) as info:  # not saved by this trainer: nothing to wait for
            services.trainer.WaitCheckpoint(pb.WaitCheckpointRequest(checkpoint_dir=second.checkpoint_dir))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

        # The HF export: only HF files, the trainer's weights.
        exported = services.trainer.ExportHF(pb.ExportHFRequest(path=str(tmp_path / "hf")))
        hf_dir = Path(exported.hf_dir)
        assert (hf_dir, exported.global_step) == (tmp_path / "hf" / "iter_0000001", 1)
        side_files = {name for name in SIDE_FILES if (small_model_dir / name).is_file()}
        assert "tokenizer.json" in side_files
        assert {p.name for p in hf_dir.iterdir()} == {"model.safetensors", "config.json"} | side_files
        assert [p.name for p in (tmp_path / "hf").iterdir()] == ["iter_0000001"]  # no checkpoint beside
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        written = load_file(str(hf_dir / "model.safetensors"))
        assert "lm_head.weight" not in written  # the tied embedding, once
        state = model.state_dict()
        for name, tensor in written.items():
            assert torch.equal(state[name], tensor), name
        services.close()
