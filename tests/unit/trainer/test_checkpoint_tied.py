"""A run checkpoint stores a tied embedding once, loads it back tied, and still reads a
checkpoint written with both names (before #26)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from rollway.trainer import checkpoint


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _sharded(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _stored_keys(directory) -> set[str]:
    return set(dcp.FileSystemReader(str(directory / "model")).read_metadata().state_dict_metadata)


def _embedding(model) -> torch.Tensor:
    return model.get_input_embeddings().weight.full_tensor().detach().clone()


def test_a_tied_embedding_is_stored_once_and_loads_tied(tiny_model_dir, tmp_path, one_rank):
    model, optimizer = _sharded(tiny_model_dir)
    assert checkpoint.tied_aliases(model, get_model_state_dict(model)) == {
        "lm_head.weight": "model.embed_tokens.weight"
    }
    with torch.no_grad():  # a trained value, so the fresh model below cannot pass by its init
        model.get_input_embeddings().weight.add_(0.5)
    checkpoint.save_shards(model, optimizer, tmp_path)
    keys = _stored_keys(tmp_path)
    assert "model.model.embed_tokens.weight" in keys and "model.lm_head.weight" not in keys

    fresh, fresh_optimizer = _sharded(tiny_model_dir)
    checkpoint.load_shards(fresh, fresh_optimizer, tmp_path)
    assert fresh.get_output_embeddings().weight is fresh.get_input_embeddings().weight
    torch.testing.assert_close(_embedding(fresh), _embedding(model), rtol=0, atol=0)


def test_a_checkpoint_with_both_names_still_loads(tiny_model_dir, tmp_path, one_rank):
    model, optimizer = _sharded(tiny_model_dir)
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(0.5)
    checkpoint.save_shards(model, optimizer, tmp_path)  # the optimizer and RNG files
    shutil.rmtree(tmp_path / "model")
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(tmp_path / "model"))  # both
    assert "model.lm_head.weight" in _stored_keys(tmp_path)

    fresh, fresh_optimizer = _sharded(tiny_model_dir)
    checkpoint.load_shards(fresh, fresh_optimizer, tmp_path)
    torch.testing.assert_close(_embedding(fresh), _embedding(model), rtol=0, atol=0)
