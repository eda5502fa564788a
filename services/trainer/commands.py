"""The commands rank 0 runs on every trainer rank, and the one place that executes them.

    controller.py / weight_sync/pusher.py -> RankRuntime.run([command for rank 0, rank 1, ...])
        rank 0: execute(engine, commands[0])          workers (worker.py): execute(engine, received)

Each command is a frozen dataclass with typed fields (its rank's share of the work), so a reader
goes from the caller to the engine method with "go to definition", and a command the code does
not know is a `match` that falls through, not a `getattr` on a string. Rank 0's commands are
handed to its engine directly; the workers' travel pickled and signed (distributed.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rollway.trainer.engine import TrainerEngine
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.train_plan import OptimizerStepPlan
from rollway.trainer.weight_sync.passes import WeightStep, weight_pass


@dataclass(frozen=True)
class Init:
    """Apply training settings (TrainerConfig fields); build the optimizer on first use."""

    settings: dict[str, Any]


@dataclass(frozen=True)
class Train:
    """Run this rank's share of each optimizer step."""

    steps: list[OptimizerStepPlan]


@dataclass(frozen=True)
class LogProbs:
    """Response log-probs (and entropy) of this rank's micro-batches, of the policy or the reference."""

    micro_batches: list[list[SequenceItem]]
    temperature: float
    with_entropy: bool
    use_reference: bool = False


@dataclass(frozen=True)
class ForwardBackward:
    """Per-token log-probs and loss terms of a Tinker datum loss; gradients accumulate unless forward_only."""

    micro_batches: list[list[SequenceItem]]
    loss_fn: str
    loss_fn_config: dict[str, float]
    forward_only: bool


@dataclass(frozen=True)
class OptimStep:
    """Apply the accumulated gradients with the caller's AdamW hyper-parameters."""

    learning_rate: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    grad_clip_norm: float


@dataclass(frozen=True)
class Save:
    """Write this rank's checkpoint shards (and take part in the HF export) into `directory`."""

    directory: str
    hf_export: bool
    async_save: bool = False  # stage only; the write goes on in the background (async_save.py)


@dataclass(frozen=True)
class ExportHf:
    """Take part in a Hugging Face export into `directory` (rank 0 writes the files)."""

    directory: str


@dataclass(frozen=True)
class Load:
    """Read model, optimizer and RNG from a verified checkpoint directory."""

    directory: str
    global_step: int


@dataclass(frozen=True)
class ActivateAdapter:
    """Make a LoRA tenant's adapters the live ones (lora_tenants.py)."""

    adapter: str


@dataclass(frozen=True)
class DropAdapter:
    """Forget a LoRA tenant's adapters, optimizer state and gradients."""

    adapter: str


@dataclass(frozen=True)
class Checksum:
    """sha256 of the full weights cast to `dtype` (answered on rank 0)."""

    dtype: str


@dataclass(frozen=True)
class WeightPass:
    """A step of a weight push on every rank, in the weights' bucket layout (weight_sync/passes.py:
    the checksums, the broadcast or the files; which one is the step's type)."""

    dtype: str
    bucket_size_bytes: int
    step: WeightStep


@dataclass(frozen=True)
class Shutdown:
    """Leave the command loop (workers only: rank 0 stops its ranks through the runtime)."""


Command = (
    Init | Train | LogProbs | ForwardBackward | OptimStep | Save | ExportHf | Load | ActivateAdapter
    | DropAdapter | Checksum | WeightPass | Shutdown
)  # fmt: skip


def command_name(command: Command) -> str:
    """The command's name in logs and errors, as the engine method it runs: LogProbs -> log_probs."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(command).__name__).lower()


def execute(engine: TrainerEngine, command: Command) -> Any:
    """Run `command` on this rank's engine; what rank 0 needs is returned (other ranks' is dropped)."""
    match command:
        case Init(settings):
            return engine.init(settings)
        case Train(steps):
            return engine.train(steps)
        case LogProbs(micro_batches, temperature, with_entropy, use_reference):
            return engine.log_probs(micro_batches, temperature, with_entropy, use_reference)
        case ForwardBackward(micro_batches, loss_fn, loss_fn_config, forward_only):
            return engine.forward_backward(micro_batches, loss_fn, loss_fn_config, forward_only)
        case OptimStep(learning_rate, betas, eps, weight_decay, grad_clip_norm):
            return engine.optim_step(learning_rate, betas, eps, weight_decay, grad_clip_norm)
        case Save(directory, hf_export, async_save):
            return engine.save(directory, hf_export, async_save)
        case ExportHf(directory):
            return engine.export_hf(directory)
        case Load(directory, global_step):
            return engine.load(directory, global_step)
        case ActivateAdapter(adapter):
            return engine.activate_adapter(adapter)
        case DropAdapter(adapter):
            return engine.drop_adapter(adapter)
        case Checksum(dtype):
            return engine.checksum(dtype)
        case WeightPass(dtype, bucket_size_bytes, step):
            return weight_pass(engine, dtype, bucket_size_bytes, step)
        case Shutdown():
            return None
    raise TypeError(f"not a trainer command: {command!r}")
