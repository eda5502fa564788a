"""Run RL scenarios of the trainer engine on N real gloo ranks (spawned), for the RL tests.

    results = run_scenarios(2, [(scenario_fn, {...}), ...], tmp_path)

Scenario functions are module-level (spawn pickles them by name), take (info, **kwargs) and run
on every rank; rank 0's return values come back. They mirror what the controller does
(train_plan, then engine commands), without gRPC.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from rollway.common.config import from_dict, to_dict
from rollway.trainer.config import TrainerConfig
from rollway.trainer.engine import TrainerEngine
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.train_plan import plan_train_steps
from support.rank_harness import run_on_ranks


def make_config(model_dir: str | Path, **settings: Any) -> TrainerConfig:
    """fp32 (exact on CPU), policy_loss, the given overrides."""
    return from_dict(TrainerConfig, {"hf_checkpoint": str(model_dir), "dtype": "float32", **settings})


def new_engine(info, config: TrainerConfig) -> TrainerEngine:
    engine = TrainerEngine(config, info)
    engine.init(to_dict(config))
    return engine


def full_grads(engine: TrainerEngine) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient (a collective: all ranks call it)."""
    return {
        name: param.grad.full_tensor().clone()
        for name, param in sorted(engine.model.named_parameters())
        if param.grad is not None
    }


def step_gradients(engine: TrainerEngine, items: list[SequenceItem], settings: TrainerConfig):
    """Metrics and full gradients of the first optimizer step of a TrainStep (no update)."""
    items = copy.deepcopy(items)  # the pre-pass writes into the items
    per_rank, _ = plan_train_steps(items, settings, engine.info.world_size)
    steps = per_rank[engine.info.rank]
    engine.fill_policy_inputs(steps, settings)
    metrics = engine.accumulate_gradients(steps[0])
    grads = full_grads(engine)
    engine.optimizer.zero_grad(set_to_none=True)
    return metrics, grads


def train(engine: TrainerEngine, items: list[SequenceItem], settings: TrainerConfig) -> list[dict]:
    per_rank, _ = plan_train_steps(copy.deepcopy(items), settings, engine.info.world_size)
    return engine.train(per_rank[engine.info.rank])


def run_scenarios(world_size: int, scenarios: list, tmp_path: Path) -> list[Any]:
    """Run `scenarios` [(fn, kwargs)] on `world_size` spawned gloo ranks; rank 0's results."""
    return run_on_ranks(world_size, scenarios, tmp_path)
