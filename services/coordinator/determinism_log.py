"""debug_determinism: one line a step in RUN_DIR/determinism.jsonl with a hash of the step's data,
its loss and the trainer's weight checksum, so two runs that should be identical can be compared
line by line."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from rollway.common.v1 import common_pb2
from rollway.trainer.v1 import trainer_pb2

LOG_FILE = "determinism.jsonl"


def record_step(
    run_dir: Path, step: int, samples: Iterable[common_pb2.Sample], metrics: dict[str, float], trainer
) -> None:
    """Append step `step`'s line; `trainer` None (no trainer in the run): no weight checksum."""
    data = hashlib.sha256()
    for s in samples:
        data.update(bytes(str((list(s.prompt_token_ids), list(s.response_token_ids))), "utf8"))
    record = {
        "step": step,
        "data": data.hexdigest(),
        "loss": metrics.get("train/loss", metrics.get("sft/loss")),
    }
    if trainer is not None:
        reply = trainer.WeightChecksum(trainer_pb2.WeightChecksumRequest(dtype="float32"))
        record["weights"] = reply.checksum.digest
    with (run_dir / LOG_FILE).open("a") as f:
        f.write(json.dumps(record) + "\n")
