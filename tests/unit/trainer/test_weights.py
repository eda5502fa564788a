"""Which tensors make up the weights, and the checksum the rollout engines compare with."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rollway.common.weights_checksum import weights_checksum
from rollway.trainer.weights import full_weights_checksum, iter_full_tensors, parameter_names, weight_names


def test_weight_names_list_tied_weights_once_and_skip_non_persistent_buffers():
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(4, 2)
    model.head = torch.nn.Linear(2, 4, bias=False)
    model.head.weight = model.embed.weight
    model.register_buffer("inv_freq", torch.ones(1), persistent=False)
    model.register_buffer("scale", torch.ones(1))
    assert parameter_names(model) == ["embed.weight"]
    assert weight_names(model) == ["embed.weight", "scale"]


def test_full_tensors_are_copies_in_the_requested_dtype():
    model = torch.nn.Linear(2, 2)
    (name, tensor), *_ = iter_full_tensors(model, ["weight"], torch.bfloat16)
    assert name == "weight" and tensor.dtype == torch.bfloat16
    tensor.zero_()
    assert model.weight.abs().sum() > 0


def test_checksum_equals_the_shared_function_over_named_parameters(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    expected = weights_checksum(model.named_parameters(), torch.bfloat16)
    assert full_weights_checksum(model, torch.bfloat16) == expected
    assert expected[1] == len(list(model.parameters()))
