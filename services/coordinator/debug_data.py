"""Dump and replay rollouts (Miles' --save-debug-rollout-data / --load-debug-rollout-data).

A path template holds `{rollout_id}` (e.g. /tmp/dump/rollout_{rollout_id}.pb); a template
without it is a directory and gets rollout_{rollout_id}.pb inside. Each file is one serialized
SampleChunk: samples with tokens, rewards, rollout log-probs, advantages and weight versions,
bit-exact, so a replay trains on exactly what was generated.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from rollway.common.errors import NotFound
from rollway.common.v1 import common_pb2
from rollway.trainer.v1 import trainer_pb2


def rollout_path(template: str, rollout_id: int) -> Path:
    if "{rollout_id}" in template:
        return Path(template.format(rollout_id=rollout_id))
    return Path(template) / f"rollout_{rollout_id}.pb"


def save_rollout(template: str, rollout_id: int, samples: Sequence[common_pb2.Sample]) -> Path:
    path = rollout_path(template, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(trainer_pb2.SampleChunk(samples=samples).SerializeToString())
    os.replace(tmp, path)
    return path


def load_rollout(template: str, rollout_id: int) -> list[common_pb2.Sample]:
    path = rollout_path(template, rollout_id)
    if not path.exists():
        raise NotFound(f"load_debug_rollout_data: no dump for rollout {rollout_id} at {path}")
    chunk = trainer_pb2.SampleChunk()
    chunk.ParseFromString(path.read_bytes())
    return list(chunk.samples)
