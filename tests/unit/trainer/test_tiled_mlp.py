"""TiledMLP in one process: outputs and gradients equal the untiled MLP's (fp32), the tile count
rule, frozen parameters, and a whole model with every decoder MLP tiled."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

from rollway.trainer.tiled_mlp import enable_tiled_mlp, num_tiles, tiled_forward


def test_tile_count_rule():
    assert num_tiles(4096, 1024, 0) == 4  # ALST: ceil(tokens / hidden)
    assert num_tiles(4097, 1024, 0) == 5
    assert num_tiles(100, 1024, 0) == 1
    assert num_tiles(16384, 4096, 0) == 4
    assert num_tiles(16384, 256, 0) == 16  # small hidden sizes: tiles of 1024 tokens at least
    assert num_tiles(100, 1024, 8) == 8  # explicit
    assert num_tiles(3, 1024, 8) == 3  # never more tiles than tokens


def grads_of(mlp: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor):
    x = x.clone().requires_grad_(True)
    y = mlp(x)
    y.backward(grad)
    out = (
        y.detach(),
        x.grad,
        {n: p.grad.clone() if p.grad is not None else None for n, p in mlp.named_parameters()},
    )
    mlp.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("tiles", [2, 5, 37])
def test_tiled_mlp_matches_the_untiled_mlp(tiles):
    torch.manual_seed(0)
    mlp = Qwen3MLP(Qwen3Config(hidden_size=32, intermediate_size=96)).double()
    x, grad = torch.randn(2, 37, 32, dtype=torch.float64), torch.randn(2, 37, 32, dtype=torch.float64)
    y0, gx0, gp0 = grads_of(mlp, x, grad)
    mlp.forward = tiled_forward(mlp, mlp.forward, tiles, 32)
    y1, gx1, gp1 = grads_of(mlp, x, grad)
    torch.testing.assert_close(y1, y0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx1, gx0, rtol=1e-12, atol=1e-12)
    for name in gp0:
        torch.testing.assert_close(gp1[name], gp0[name], rtol=1e-10, atol=1e-12)


def test_frozen_parameters_get_no_gradient():
    torch.manual_seed(0)
    mlp = Qwen3MLP(Qwen3Config(hidden_size=16, intermediate_size=32))
    mlp.up_proj.weight.requires_grad_(False)
    mlp.forward = tiled_forward(mlp, mlp.forward, 3, 16)
    _, _, grads = grads_of(mlp, torch.randn(1, 9, 16), torch.randn(1, 9, 16))
    assert grads["up_proj.weight"] is None
    assert grads["gate_proj.weight"] is not None and grads["down_proj.weight"] is not None


def test_every_decoder_mlp_of_a_model_is_tiled_with_equal_gradients(tiny_model_dir):
    def loss_and_grads(shards: int):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        if shards:
            assert (
                enable_tiled_mlp(model, shards, set(model._no_split_modules))
                == model.config.num_hidden_layers
            )
        ids = torch.arange(3, 3 + 50).reshape(1, 50)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.item(), {n: p.grad for n, p in model.named_parameters()}

    loss0, grads0 = loss_and_grads(0)
    loss1, grads1 = loss_and_grads(4)
    assert loss1 == pytest.approx(loss0, rel=1e-6)
    for name, grad in grads0.items():
        torch.testing.assert_close(grads1[name], grad, rtol=1e-4, atol=1e-6)
