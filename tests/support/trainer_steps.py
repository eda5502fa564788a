"""A small SFT TrainStep sent the way the coordinator sends it (header chunk, then samples), and
the Struct its overrides travel in."""

from __future__ import annotations

from google.protobuf import struct_pb2

from rollway.common.v1 import common_pb2
from rollway.coordinator.remote import Services
from rollway.trainer.v1 import trainer_pb2


def struct(data: dict) -> struct_pb2.Struct:
    """A TrainStep's `overrides` (or any Struct field) from a plain dict."""
    value = struct_pb2.Struct()
    value.update(data)
    return value


def train_sft_step(services: Services, step_id: int) -> None:
    """One optimizer step on four fixed short samples: moves the weights, so a sync has work."""
    samples = [
        common_pb2.Sample(
            prompt_token_ids=[1, 40 + k], response_token_ids=[50 + k, 51, 52, 2], loss_mask=[1] * 4
        )
        for k in range(4)
    ]
    header = trainer_pb2.TrainStepHeader(
        step_id=step_id, num_samples=len(samples), overrides=struct({"loss_type": "sft_loss"})
    )
    chunks = [
        trainer_pb2.TrainStepRequest(header=header),
        trainer_pb2.TrainStepRequest(samples={"samples": samples}),
    ]
    services.trainer.TrainStep(iter(chunks))
