"""tests/unit is the fast tier (`make test-fast`): in-process tests only. A module here that starts
processes, servers or ranks, or is marked slow as a whole, belongs in tests/integration (every
test outside tests/unit is slow, tests/conftest.py); a single in-process test of more than ~2 s
may stay, marked slow. Checked on the source, so a new one fails at once."""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).resolve().parent

# Modules that start processes: the stdlib's and torch's, and the test helpers built on them.
PROCESS_STARTERS = (
    "subprocess",
    "multiprocessing",
    "torch.multiprocessing",
    "rollway.deploy.local_processes",
    "support.gateway",
    "support.processes",
    "support.rank_harness",
    "support.rl_harness",
    "support.rl_scenarios",
    "support.rl_stack",
    "support.sglang_servers",
    "support.stack",
)
# Names that start one whichever module they come from.
PROCESS_NAMES = {"Popen", "ServerProcess", "ServiceProcess", "spawn", "start_processes"}


def _starts_processes(module: str) -> bool:
    return any(module == starter or module.startswith(f"{starter}.") for starter in PROCESS_STARTERS)


def _marks_the_module_slow(node: ast.AST) -> bool:
    """`pytestmark = pytest.mark.slow` (alone or in a list)."""
    return (
        isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)
        and "mark.slow" in ast.unparse(node.value)
    )


def tier_violations(path: Path) -> list[str]:
    """What in the module at `path` does not belong in the fast tier, one line each."""
    tree = ast.parse(path.read_text())
    found = [(node.lineno, "marked slow as a whole") for node in tree.body if _marks_the_module_slow(node)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
            names = []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
            names = [alias.name for alias in node.names]
        else:
            continue
        starters = [module for module in modules if _starts_processes(module)]
        found += [(node.lineno, f"imports {module}") for module in starters]
        if not starters:
            found += [
                (node.lineno, f"imports {node.module}.{name}")
                for name in names
                if name in PROCESS_NAMES or _starts_processes(f"{node.module}.{name}")
            ]
    return [f"{path.name}:{line}: {what}" for line, what in sorted(found)]


def test_the_unit_tier_starts_no_processes_and_no_module_is_slow():
    broken = [line for path in sorted(UNIT.rglob("*.py")) for line in tier_violations(path)]
    assert broken == [], "move these to tests/integration (or make them fast):\n" + "\n".join(broken)


def test_a_planted_process_or_slow_module_is_found(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "import subprocess\n"
        "import pytest\n"
        "from torch.multiprocessing import spawn\n"
        "from support import rank_harness\n"
        "from rollway.rollout.engines.sglang_server import ServerProcess, launch_command\n"
        "pytestmark = [pytest.mark.slow]\n"
        "@pytest.mark.slow\n"
        "def test_x():\n"
        "    from support.stack import start_stack\n"
    )
    assert tier_violations(planted) == [
        "test_planted.py:1: imports subprocess",
        "test_planted.py:3: imports torch.multiprocessing",
        "test_planted.py:4: imports support.rank_harness",
        "test_planted.py:5: imports rollway.rollout.engines.sglang_server.ServerProcess",
        "test_planted.py:6: marked slow as a whole",
        "test_planted.py:9: imports support.stack",
    ]
