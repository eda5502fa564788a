"""A push's steps on one trainer rank (rollway.trainer.weight_sync.passes): the step's type
chooses the pass, on a real model. The broadcast step needs a weight group: its pass is tested
against a real receiver in tests/unit/rollout/test_weight_receive.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import AutoModelForCausalLM

from rollway.common.weight_sync.buckets import bucket_file_name
from rollway.trainer.weight_sync.base import Checksums
from rollway.trainer.weight_sync.disk import WriteFiles
from rollway.trainer.weight_sync.passes import weight_pass

BUCKET_BYTES = 1 << 20  # the tiny model's ~4 MB make several buckets


def test_the_steps_type_chooses_the_pass(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    engine = SimpleNamespace(model=model, info=SimpleNamespace(rank=0), hf_config=model.config)
    planned = weight_pass(engine, "float32", BUCKET_BYTES, Checksums())
    directory = tmp_path / "weights"
    directory.mkdir()
    written = weight_pass(engine, "float32", BUCKET_BYTES, WriteFiles(str(directory)))
    assert len(planned.buckets) > 1, "the layout should split the model"
    assert not written.error, written.error
    # The files' checksums, summed as they are written, equal the plan's summed from the shards.
    assert [b.checksum for b in written.buckets] == [b.checksum for b in planned.buckets]
    assert all(b.checksum for b in planned.buckets)
    names = {bucket_file_name(b.index, len(planned.buckets)) for b in planned.buckets}
    assert names <= {p.name for p in directory.iterdir()}
    with pytest.raises(TypeError, match="not a weight-pass step: 'broadcast'"):
        weight_pass(engine, "float32", BUCKET_BYTES, "broadcast")
