"""TiledMLP (ALST): a decoder MLP computed over sequence tiles, so the [tokens, intermediate]
activations of the whole sequence never exist at once - in forward or in backward.

    forward  (no grad):  y[tile] = mlp(x[tile]) for each tile; only x is kept for backward
    backward:            for each tile: recompute mlp(x[tile]) with grad, backprop dy[tile],
                         add the tile's parameter gradients to a running sum
                         -> the sum is returned once per parameter, like an untiled MLP

The autograd function takes the MLP's parameters as inputs and returns their gradients, so
autograd accumulates each parameter's gradient exactly once per MLP call. Under FSDP2 the
parameters seen during forward and backward are the layer's unsharded tensors, and its
reduce-scatter runs once in the layer's post-backward, after every tile - never per tile.
Frozen parameters (LoRA base weights) get no gradient. The forward is patched on the MLP
module instance, so parameter names, checkpoints and exports are unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

TILED_ATTRIBUTE = "_rollway_tiled_mlp"
# Automatic tiles are never shorter than this: small models' tiny tiles make slow small matmuls.
MIN_TILE_TOKENS = 1024


def num_tiles(num_tokens: int, hidden_size: int, shards: int) -> int:
    """Tiles of a call: `shards` if set, else ALST's rule ceil(tokens / hidden_size) with tiles of
    at least MIN_TILE_TOKENS; never more tiles than tokens."""
    wanted = shards if shards > 0 else math.ceil(num_tokens / max(hidden_size, MIN_TILE_TOKENS))
    return max(1, min(wanted, num_tokens))


class TiledMLPFunction(torch.autograd.Function):
    """y = forward_fn(x), computed tile by tile over the flattened tokens of x."""

    @staticmethod
    def forward(ctx, forward_fn: Callable, tiles: int, x: torch.Tensor, *params: torch.Tensor):
        ctx.forward_fn, ctx.tiles, ctx.params = forward_fn, tiles, params
        ctx.save_for_backward(x)
        flat = x.reshape(-1, x.shape[-1])
        with torch.no_grad():
            outputs = [forward_fn(part) for part in flat.tensor_split(tiles, dim=0)]
        return torch.cat(outputs, dim=0).reshape(*x.shape[:-1], outputs[0].shape[-1])

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (x,) = ctx.saved_tensors
        params = ctx.params
        trainable = [p for p in params if p.requires_grad]
        flat_x = x.detach().reshape(-1, x.shape[-1])
        flat_grad = grad_output.reshape(-1, grad_output.shape[-1])
        grad_x = torch.empty_like(flat_x) if ctx.needs_input_grad[2] else None
        param_grads = [None] * len(trainable)
        start = 0
        for x_tile, g_tile in zip(
            flat_x.tensor_split(ctx.tiles, dim=0), flat_grad.tensor_split(ctx.tiles, dim=0), strict=True
        ):
            x_tile = x_tile.detach().requires_grad_(grad_x is not None)
            with torch.enable_grad():
                y_tile = ctx.forward_fn(x_tile)
                wrt = ([x_tile] if grad_x is not None else []) + trainable
                grads = torch.autograd.grad(y_tile, wrt, g_tile, allow_unused=True) if wrt else ()
            if grad_x is not None:
                grad_x[start : start + x_tile.shape[0]] = grads[0]
                grads = grads[1:]
            for k, grad in enumerate(grads):
                if grad is not None:  # summed in at least fp32: bf16 sums would lose small tiles
                    grad = grad.to(torch.promote_types(grad.dtype, torch.float32))
                    param_grads[k] = grad if param_grads[k] is None else param_grads[k] + grad
            start += x_tile.shape[0]
        by_param = iter(param_grads)
        out_params = tuple(_as_param_grad(next(by_param), p) if p.requires_grad else None for p in params)
        return (None, None, grad_x.reshape(x.shape) if grad_x is not None else None, *out_params)


def _as_param_grad(grad: torch.Tensor | None, param: torch.Tensor) -> torch.Tensor | None:
    return None if grad is None else grad.to(param.dtype)


def tiled_forward(mlp: torch.nn.Module, original: Callable, shards: int, hidden_size: int):
    """The patched forward of one MLP module."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        tiles = num_tiles(x.numel() // x.shape[-1], hidden_size, shards)
        if tiles == 1:
            return original(x)
        params = tuple(mlp.parameters())  # under FSDP2: the unsharded tensors of this forward
        return TiledMLPFunction.apply(original, tiles, x, *params)

    return forward


def enable_tiled_mlp(model: torch.nn.Module, shards: int, layer_classes: set[str]) -> int:
    """Patch the `mlp` of every decoder layer (classes named in `layer_classes`); returns the count."""
    hidden_size = int(getattr(model.config, "hidden_size", 0) or 0)
    count = 0
    for module in model.modules():
        mlp = getattr(module, "mlp", None)
        if type(module).__name__ not in layer_classes or mlp is None or hasattr(mlp, TILED_ATTRIBUTE):
            continue
        mlp.forward = tiled_forward(mlp, mlp.forward, shards, hidden_size)
        setattr(mlp, TILED_ATTRIBUTE, True)
        count += 1
    return count
