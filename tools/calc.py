"""``calculate``: exact arithmetic for the model, without a shell.

The expression is parsed (``ast``), never evaluated as Python: numbers,
``+ - * / // % **``, parentheses and unary signs only. Integers stay exact;
``/`` gives a float (an integral one is shown without ``.0``). Limits keep a
hostile expression cheap: 500 characters, exponents up to 10,000 with a
result under 10,000 digits.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from coterie.runtime.context import TurnContext
from coterie.runtime.errors import ToolError
from coterie.runtime.tool import tool

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 10_000
MAX_DIGITS = 10_000

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class CalculateArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expression: str = Field(
        max_length=MAX_EXPRESSION_CHARS,
        description="arithmetic, e.g. (17 + 25) * 3 / 2 or 2 ** 10 % 7",
    )


def _too_big(value: Number) -> bool:
    if isinstance(value, int):
        return value != 0 and math.log10(abs(value)) >= MAX_DIGITS
    return math.isinf(value) or math.isnan(value)


def evaluate(expression: str) -> Number:
    """The value of ``expression``; ``ValueError`` saying what is not allowed."""
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # thousands separators
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None

    def walk(node: ast.AST) -> Number:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            value: Number = node.value  # type: ignore[assignment]
            return value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is above {MAX_EXPONENT}")
            try:
                value = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
            except OverflowError:
                raise ValueError("the result is too large") from None
            if isinstance(value, complex) or _too_big(value):
                raise ValueError("the result is too large (or not a real number)")
            return value
        raise ValueError(
            f"only numbers, + - * / // % ** and parentheses are allowed, not {ast.unparse(node)!r}"
        )

    return walk(tree)


def format_number(value: Number) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


@tool(name="calculate", timeout=10, allow_repeat=True)
async def calculate(args: CalculateArgs, ctx: TurnContext) -> str:
    """Evaluate an arithmetic expression exactly (numbers, + - * / // % **,
    parentheses). Use it instead of doing arithmetic in your head."""
    try:
        return format_number(evaluate(args.expression))
    except ValueError as exc:
        raise ToolError("invalid_arguments", f"expression: {exc}") from None


CALC_TOOLS = [calculate]

__all__ = ["CALC_TOOLS", "calculate", "evaluate", "format_number"]
