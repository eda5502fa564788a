"""The calculator tool (safe arithmetic, no eval) and Qwen3 <tool_call> parsing."""

import pytest

from rollway.rollout.environments.base import EpisodeStart, ModelTurn
from rollway.rollout.environments.calculator import CalculatorEnvironment, CalculatorError, evaluate
from rollway.rollout.environments.tool_calls import format_tool_call, parse_tool_calls


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1234 + 567", "1801"),
        ("2*(3+4)", "14"),
        ("-7 // 2", "-4"),
        ("7 / 2", "3.5"),
        ("2**10", "1024"),
        ("10 % 3", "1"),
    ],
)
def test_calculator_computes_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("__import__('os').system('true')", "not allowed"),
        ("x + 1", "not allowed"),
        ("9**9**9", "exponent"),
        ("1/0", "division by zero"),
        ("1 +", "cannot parse"),
        ("'a' * 3", "not allowed"),
        ("1" * 300, "longer than"),
    ],
)
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression, problem):
    with pytest.raises(CalculatorError, match=problem):
        evaluate(expression)


def test_tool_calls_are_parsed_in_qwen3_format():
    text = (
        "Let me compute. "
        + format_tool_call("calculator", {"expression": "12+30"})
        + "\n<tool_call>\n{bad\n</tool_call>"
    )
    calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["calculator", ""]
    assert calls[0].arguments == {"expression": "12+30"} and not calls[0].error
    assert "not valid JSON" in calls[1].error
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}')[0].arguments == {"a": 1}
    assert parse_tool_calls("no calls here") == []


def test_calculator_environment_answers_calls_then_rewards_the_answer():
    env = CalculatorEnvironment()
    env.reset(EpisodeStart(prompt="What is 1234 + 567?", label="1801", metadata={}, prompt_token_ids=(1,)))
    call = env.step(ModelTurn(format_tool_call("calculator", {"expression": "1234 + 567"}), (), "stop"))
    assert call.messages == [{"role": "tool", "content": "1801"}] and not call.done and call.reward == 0
    unknown = env.step(ModelTurn(format_tool_call("search", {"q": "x"}), (), "stop"))
    assert "unknown tool 'search'" in unknown.messages[0]["content"]
    answer = env.step(ModelTurn(" 1801 ", (), "stop"))
    assert answer.done and answer.reward == 1.0
    assert env.step(ModelTurn("1800", (), "stop")).reward == 0.0
