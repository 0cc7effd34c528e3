"""The calculate tool and scripted tool-call arguments with templates."""

from __future__ import annotations

import pytest

from coterie.runtime.config import ScriptedModelConfig
from coterie.runtime.messages import ModelRequest, UserMessage
from coterie.runtime.models.scripted import RulesModel, tool_call
from coterie.runtime.runner import ToolRunner
from coterie.runtime.testing import turn_context
from coterie.tools import builtin_registry
from coterie.tools.calc import evaluate, format_number


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("17 + 25", "42"),
        ("(3 + 4) * (5 - 2)", "21"),
        ("10 / 4", "2.5"),
        ("10 / 5", "2"),
        ("7 // 2", "3"),
        ("2 ** 10 % 7", "2"),
        ("-3 * -3", "9"),
        ("1,234 + 8,766", "10000"),
        ("2 ^ 8", "256"),
        ("6 × 7", "42"),
        ("2 ** 200", str(2**200)),
    ],
)
def test_arithmetic_is_exact(expression: str, value: str) -> None:
    assert format_number(evaluate(expression)) == value


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("__import__('os').system('true')", "only numbers"),
        ("six times seven", "not an arithmetic expression"),
        ("x + 1", "only numbers"),
        ("1 / 0", "division by zero"),
        ("2 ** 100000", "exponent 100000 is above 10000"),
        ("9 ** 9999 * 9 ** 9999 * 9 ** 9999", "too large"),
        ("'a' * 3", "only numbers"),
        ("(-8) ** 0.5", "not a real number"),
    ],
)
def test_anything_else_is_refused(expression: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        evaluate(expression)


async def test_the_tool_returns_the_value_or_an_error_for_the_model() -> None:
    ctx = turn_context()
    tools = builtin_registry().visible(ctx)
    assert "calculate" in tools
    runner = ToolRunner()
    ok, bad = await runner.run_calls(
        [
            tool_call("calculate", {"expression": "17 * 23"}),
            tool_call("calculate", {"expression": "1/0"}),
        ],
        ctx,
        tools,
    )
    assert ok.content == "391" and ok.error_kind is None
    assert bad.error_kind == "invalid_arguments" and "division by zero" in bad.content


async def test_scripted_tool_call_arguments_fill_templates() -> None:
    config = ScriptedModelConfig.model_validate(
        {
            "provider": "scripted",
            "rules": [
                {
                    "tool_calls": [
                        {
                            "name": "calculate",
                            "arguments": {"expression": "{input}", "note": ["x {input}"], "n": 3},
                        }
                    ]
                }
            ],
        }
    )
    model = RulesModel(config)
    request = ModelRequest(system="", messages=[UserMessage(text="2 + 2")])
    (call,) = (await model.request(request)).message.tool_calls
    assert call.arguments == {"expression": "2 + 2", "note": ["x 2 + 2"], "n": 3}
