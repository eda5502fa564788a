"""Weight transports are organised the same way on both sides (rollway.*.weight_sync).

Every transport of the protocol (rollway.common.weight_sync.transports.TRANSPORTS) has a Sender in the
trainer's registry and a Receiver in the rollout service's, each in a module named after the
transport; the choice of a transport goes through those registries, never through a comparison
with a transport's name; and no production weight-sync module reads the environment (tests inject
faults by registering a wrapping receiver: tests/support/weight_faults.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

from rollway.common.weight_sync.transports import TRANSPORTS
from rollway.rollout.weight_sync.base import Receiver
from rollway.rollout.weight_sync.registry import RECEIVERS
from rollway.trainer.weight_sync.base import Sender
from rollway.trainer.weight_sync.registry import SENDERS

SERVICES = Path(__file__).resolve().parents[3] / "services"
WEIGHT_SYNC = [SERVICES / "trainer" / "weight_sync", SERVICES / "rollout" / "weight_sync"]


def test_every_transport_has_a_sender_and_a_receiver_in_a_module_of_its_name():
    assert set(SENDERS) == set(RECEIVERS) == set(TRANSPORTS)
    for name in TRANSPORTS:
        assert issubclass(SENDERS[name], Sender) and issubclass(RECEIVERS[name], Receiver)
        assert SENDERS[name].transport == name  # the name its manifests carry
        assert SENDERS[name].__module__ == f"rollway.trainer.weight_sync.{name}"
        assert RECEIVERS[name].__module__ == f"rollway.rollout.weight_sync.{name}"


def transport_comparisons(source: str) -> list[int]:
    """Lines comparing something named `transport` (x.transport, transport) with a string."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = [o.attr if isinstance(o, ast.Attribute) else getattr(o, "id", "") for o in operands]
        if any(n == "transport" for n in names) and any(
            isinstance(o, ast.Constant) and isinstance(o.value, str) for o in operands
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_chooses_a_transport_by_comparing_its_name():
    found = {
        str(path.relative_to(SERVICES)): lines
        for path in sorted(SERVICES.rglob("*.py"))
        if "v1" not in path.parts and (lines := transport_comparisons(path.read_text()))
    }
    assert found == {}


def test_the_check_catches_a_planted_comparison():
    assert transport_comparisons('if manifest.transport == "disk":\n    pass\n') == [1]
    assert transport_comparisons('if "disk" != transport:\n    pass\n') == [1]


def reads_environment(source: str) -> bool:
    return any(
        (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"))
        or (isinstance(node, ast.alias) and node.name in ("environ", "getenv"))
        for node in ast.walk(ast.parse(source))
    )


def test_weight_sync_modules_do_not_read_the_environment():
    readers = [
        str(p)
        for folder in WEIGHT_SYNC
        for p in sorted(folder.glob("*.py"))
        if reads_environment(p.read_text())
    ]
    assert readers == []
    assert reads_environment("import os\nslow = os.environ.get('X')\n")  # a planted read is caught
