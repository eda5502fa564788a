"""The built-in calculator tool and the environment that offers it.

`evaluate(expression)` walks the expression's syntax tree (ast) and computes only numbers,
parentheses and + - * / // % ** with unary signs; anything else (names, calls, attributes) is
refused, and sizes are bounded so that no input can take long ("9**9**9" is refused). No `eval`.

CalculatorEnvironment: each model turn with <tool_call>s to "calculator" gets the results back as
tool messages; the first turn without a tool call is the answer, rewarded 1.0 when it equals the
label (after stripping whitespace), else 0.0.
"""

from __future__ import annotations

import ast
import math
import operator

from rollway.rollout.environments.base import Environment, EpisodeStart, ModelTurn, Step
from rollway.rollout.environments.tool_calls import parse_tool_calls

MAX_EXPRESSION_CHARS = 256
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or too large to compute."""


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        if isinstance(result, complex) or abs(result) > MAX_MAGNITUDE:
            raise CalculatorError("result out of range")
        return result
    raise CalculatorError(f"not allowed in an expression: {ast.unparse(node) or type(node).__name__}")


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression as text ("1801", "2.5"); CalculatorError if refused."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r}") from None
    value = _value(tree.body)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("result out of range")
        if value.is_integer():
            return str(int(value))
        return repr(round(value, 10))
    return str(value)


def run_calculator(arguments: dict) -> str:
    """The calculator tool: {"expression": "..."} -> the value, or an error the model can read."""
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        return 'error: the calculator takes {"expression": "<arithmetic>"}'
    try:
        return evaluate(expression)
    except CalculatorError as exc:
        return f"error: {exc}"


class CalculatorEnvironment(Environment):
    """Arithmetic questions answered with the help of the calculator tool (see the module doc)."""

    TOOLS = {"calculator": run_calculator}

    def __init__(self, tool_call_parser: str = "qwen3"):
        self.parser = tool_call_parser
        self.label = ""

    def reset(self, start: EpisodeStart) -> None:
        self.label = start.label.strip()

    def step(self, turn: ModelTurn) -> Step:
        calls = parse_tool_calls(turn.text, self.parser)
        if not calls:
            return Step(reward=float(turn.text.strip() == self.label), done=True)
        results = []
        for call in calls:
            tool = self.TOOLS.get(call.name)
            if call.error:
                results.append(f"error: {call.error}")
            elif tool is None:
                results.append(f"error: unknown tool {call.name!r}; available: {', '.join(self.TOOLS)}")
            else:
                results.append(tool(call.arguments))
        return Step(messages=[{"role": "tool", "content": r} for r in results])
