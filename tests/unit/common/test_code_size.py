"""Size limits of the hand-written code under services/ (issue #39): no function over 80 lines and
no module over 450 lines (the last seven large modules were split by job; none is exempt)."""

from __future__ import annotations

import ast
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[3] / "services"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 450


def hand_written() -> list[Path]:
    return sorted(p for p in SERVICES.rglob("*.py") if "v1" not in p.relative_to(SERVICES).parts)


def long_functions(source: str, limit: int) -> list[str]:
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_is_over_80_lines():
    found = {
        str(path.relative_to(SERVICES)): names
        for path in hand_written()
        if (names := long_functions(path.read_text(), MAX_FUNCTION_LINES))
    }
    assert found == {}
    planted = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert long_functions(planted, MAX_FUNCTION_LINES) == [f"f ({MAX_FUNCTION_LINES + 1} lines)"]


def test_no_module_is_over_450_lines():
    sizes = {str(p.relative_to(SERVICES)): p.read_text().count("\n") for p in hand_written()}
    too_long = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines (split them by job): {too_long}"
