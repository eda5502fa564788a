"""The HF export stores a tied embedding once, and transformers ties it again on load."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

from rollway.trainer.export import export_hf


@pytest.fixture
def one_rank():
    """A one-rank gloo group in this process (export_hf gathers as rank 0 of a group)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_tied_embedding_is_written_once_and_reloads_tied(tiny_model_dir, tmp_path, one_rank):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.tie_word_embeddings
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():  # a trained value, so the check is not passed by the initial weights
        model.get_input_embeddings().weight.add_(0.5)
    out = tmp_path / "hf"
    export_hf(model, config, str(tiny_model_dir), out)

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys

    reloaded = AutoModelForCausalLM.from_pretrained(out)
    embedding, lm_head = reloaded.get_input_embeddings().weight, reloaded.get_output_embeddings().weight
    assert lm_head.data_ptr() == embedding.data_ptr()  # one tensor, tied, not a copy
    torch.testing.assert_close(lm_head, model.get_input_embeddings().weight)
