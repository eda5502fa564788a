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
    PlanWeights,
    Save,
    SendWeights,
    Shutdown,
    Train,
    command_name,
    execute,
)
from rollway.trainer.engine import OptimizerStepPlan
from rollway.trainer.losses import GlobalDenominators
from rollway.trainer.micro_batch import SequenceItem
from rollway.trainer.weight_sync.disk import WriteArguments
from rollway.trainer.weight_sync.distributed import BroadcastArguments


class RecordingEngine:
    """Answers every engine method with (its name, its arguments)."""

    def __getattr__(self, name):
        return lambda *args: (name, args)


def weight_pass(name):
    return lambda engine, *args: (name, args)


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
    (PlanWeights("bfloat16", 1 << 20), ("plan_weights", ("bfloat16", 1 << 20))),
    (
        SendWeights("distributed", "bfloat16", 1 << 20, BroadcastArguments(True, 4096)),
        ("send_weights", ("distributed", "bfloat16", 1 << 20, BroadcastArguments(True, 4096))),
    ),
    (
        SendWeights("disk", "float32", 1 << 20, WriteArguments("/w/tmp")),
        ("send_weights", ("disk", "float32", 1 << 20, WriteArguments("/w/tmp"))),
    ),
]


@pytest.mark.parametrize(("command", "call"), CASES, ids=[type(c).__name__ for c, _ in CASES])
def test_a_command_runs_the_engine_method_it_names_with_its_fields(command, call, monkeypatch):
    monkeypatch.setattr(commands, "plan_weights", weight_pass("plan_weights"))
    monkeypatch.setattr(commands, "send_weights", weight_pass("send_weights"))
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
