"""Dropout off at load: every dropout probability of a config (any architecture's field names,
nested configs included) and every dropout module of the built model is 0 unless kept."""

from __future__ import annotations

import torch
from transformers import GPT2Config, Qwen3Config

from rollway.common.config import from_dict
from rollway.trainer.config import TrainerConfig
from rollway.trainer.model_loading import build_meta_model, config_dropouts, disable_dropout


def test_gpt2_and_qwen3_dropouts_are_found_and_zeroed():
    gpt2 = GPT2Config(n_embd=32, n_layer=1, n_head=2, resid_pdrop=0.1, embd_pdrop=0.2, attn_pdrop=0.3)
    assert config_dropouts(gpt2) == {
        "resid_pdrop": 0.1, "embd_pdrop": 0.2, "attn_pdrop": 0.3, "summary_first_dropout": 0.1,
    }  # fmt: skip
    qwen3 = Qwen3Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, attention_dropout=0.1)
    assert config_dropouts(qwen3) == {"attention_dropout": 0.1}
    settings = from_dict(TrainerConfig, {"hf_checkpoint": "unused", "dtype": "float32"})
    for config in (gpt2, qwen3):
        model = build_meta_model(config, settings)
        disable_dropout(config, model)
        assert config_dropouts(config) == {}
        modules = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
        assert all(m.p == 0.0 for m in modules)
    assert len([m for m in build_meta_model(gpt2, settings).modules() if isinstance(m, torch.nn.Dropout)]) > 0


def test_nested_configs_are_searched():
    outer = GPT2Config(n_embd=32, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    outer.summary_first_dropout = 0.0
    outer.text_config = Qwen3Config(hidden_size=32, num_hidden_layers=1, attention_dropout=0.25)
    assert config_dropouts(outer) == {"text_config.attention_dropout": 0.25}
    disable_dropout(outer)
    assert outer.text_config.attention_dropout == 0.0
