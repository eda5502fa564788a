"""The ranks' commands (trainer/commands.py): each reaches the engine method it names with its own
fields, survives the trip to a worker (pickle) unchanged, and anything else is refused.

The engine here records its calls: what a command then does on real ranks is covered by
test_engine_ranks.py, tests/integration/test_trainer_ranks.py and the e2e runs."""

from __future__ import annotations

import pickle
import typing

import pytest

from rollway.trainer import commands
from rollway.trainer.commands import (
    ActivateAdapter,
    Checksum,
    DropAdapter,
    ExportHf,
    ForwardBackward,
    Init,
    Load,
    LogProbs,
    OptimStep,
    Save,
    Shutdown,
    Train,
    WeightPass,
    command_name,
    execute,
)
from rollway.trainer.loss.losses import GlobalDenominators
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.train_plan import OptimizerStepPlan
from rollway.trainer.weight_sync.base import Checksums
from rollway.trainer.weight_sync.disk import WriteFiles
from rollway.trainer.weight_sync.distributed import Broadcast


class RecordingEngine:
    """Answers every engine method with (its name, its arguments)."""

    def __getattr__(self, name):
        return lambda *args: (name, args)


def weight_pass(engine, *args):
    return ("weight_pass", args)


ITEM = SequenceItem(index=3, token_ids=[1, 2, 3], response_start=1, loss_mask=[1, 1])
STEP = OptimizerStepPlan([[ITEM]], GlobalDenominators(1, 2), {"lr": 1e-5})
CASES = [
    (Init({"lr": 1e-5}), ("init", ({"lr": 1e-5},))),
    (Train([STEP]), ("train", ([STEP],))),
    (LogProbs([[ITEM]], 0.7, True, True), ("log_probs", ([[ITEM]], 0.7, True, True))),
    (
        ForwardBackward([[ITEM], []], "cross_entropy", {"beta": 0.1}, False),
        ("forward_backward", ([[ITEM], []], "cross_entropy", {"beta": 0.1}, False)),
    ),
    (OptimStep(1e-4, (0.9, 0.95), 1e-8, 0.01, 1.0), ("optim_step", (1e-4, (0.9, 0.95), 1e-8, 0.01, 1.0))),
    (Save("/ckpt/tmp", True), ("save", ("/ckpt/tmp", True, False))),
    (Save("/ckpt/tmp", False, async_save=True), ("save", ("/ckpt/tmp", False, True))),
    (ExportHf("/export/tmp"), ("export_hf", ("/export/tmp",))),
    (Load("/ckpt/iter_0000002", 2), ("load", ("/ckpt/iter_0000002", 2))),
    (ActivateAdapter("s:train:1"), ("activate_adapter", ("s:train:1",))),
    (DropAdapter("s:train:1"), ("drop_adapter", ("s:train:1",))),
    (Checksum("bfloat16"), ("checksum", ("bfloat16",))),
    (WeightPass("bfloat16", 1 << 20, Checksums()), ("weight_pass", ("bfloat16", 1 << 20, Checksums()))),
    (
        WeightPass("bfloat16", 1 << 20, Broadcast(True, 4096)),
        ("weight_pass", ("bfloat16", 1 << 20, Broadcast(True, 4096))),
    ),
    (
        WeightPass("float32", 1 << 20, WriteFiles("/w/tmp")),
        ("weight_pass", ("float32", 1 << 20, WriteFiles("/w/tmp"))),
    ),
]


def case_id(command) -> str:
    step = f"-{type(command.step).__name__}" if isinstance(command, WeightPass) else ""
    return type(command).__name__ + step


@pytest.mark.parametrize(("command", "call"), CASES, ids=[case_id(c) for c, _ in CASES])
def test_a_command_runs_the_engine_method_it_names_with_its_fields(command, call, monkeypatch):
    monkeypatch.setattr(commands, "weight_pass", weight_pass)  # passes.py's own test runs the steps
    assert execute(RecordingEngine(), command) == call
    assert command_name(command) == call[0]  # the name errors and logs use ("train failed: ...")
    assert execute(RecordingEngine(), pickle.loads(pickle.dumps(command))) == call  # a worker's copy


def test_every_command_has_a_case_and_other_objects_are_refused():
    assert {type(c) for c, _ in CASES} | {Shutdown} == set(typing.get_args(commands.Command))
    assert execute(RecordingEngine(), Shutdown()) is None
    with pytest.raises(TypeError, match="not a trainer command: 'train'"):
        execute(RecordingEngine(), "train")


def test_commands_are_frozen():
    with pytest.raises(AttributeError):
        Load("/ckpt", 2).global_step = 3
