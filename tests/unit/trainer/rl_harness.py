"""Run RL scenarios of the trainer engine on N real gloo ranks (spawned), for the RL tests.

    results = run_scenarios(2, [(scenario_fn, {...}), ...], tmp_path)

Scenario functions are module-level (spawn pickles them by name), take (info, **kwargs) and run
on every rank; rank 0's return values come back. They mirror what the controller does
(train_plan, then engine commands), without gRPC.
"""

from __future__ import annotations

import copy
import os
import pickle
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rollway.common.config import from_dict, to_dict
from rollway.trainer.config import TrainerConfig
from rollway.trainer.distributed import init_process_group
from rollway.trainer.engine import TrainerEngine
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.policy_inputs import prepare_policy_inputs
from rollway.trainer.train_plan import plan_train_steps

TIMEOUT_S = 120.0


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
    prepare_policy_inputs(engine, steps, settings)
    metrics = engine.accumulate_gradients(steps[0])
    grads = full_grads(engine)
    engine.optimizer.zero_grad(set_to_none=True)
    return metrics, grads


def train(engine: TrainerEngine, items: list[SequenceItem], settings: TrainerConfig) -> list[dict]:
    per_rank, _ = plan_train_steps(copy.deepcopy(items), settings, engine.info.world_size)
    return engine.train(per_rank[engine.info.rank])


def _rank_main(rank: int, world_size: int, store_path: str, scenarios: list, out_dir: str) -> None:
    torch.set_num_threads(1)
    info = init_process_group(dist.FileStore(store_path, world_size), rank, world_size, TIMEOUT_S)
    try:
        results = [fn(info, **kwargs) for fn, kwargs in scenarios]
        if rank == 0:
            with open(Path(out_dir, "results.pkl"), "wb") as f:
                pickle.dump(results, f)
    finally:
        dist.destroy_process_group()


def run_scenarios(world_size: int, scenarios: list, tmp_path: Path) -> list[Any]:
    """Run `scenarios` [(fn, kwargs)] on `world_size` spawned gloo ranks; rank 0's results."""
    out_dir = Path(tmp_path) / f"rl-ranks-{world_size}-{uuid.uuid4().hex[:8]}"
    out_dir.mkdir(parents=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(
        _rank_main,
        args=(world_size, str(out_dir / "store"), scenarios, str(out_dir)),
        nprocs=world_size,
        start_method="spawn",
        join=True,
    )
    with open(out_dir / "results.pkl", "rb") as f:
        return pickle.load(f)
