"""Tools that ship: the current date and time, and arithmetic. Plain functions whose signature and docstring are
their schema (voice.tool_registry); no I/O beyond the clock, nothing that blocks.
"""
from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}  # fmt: skip
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 100  # 9 ** 9 ** 9 would hold the worker for minutes


def current_time(time_zone: str = "") -> str:
    """The current date and time.

    time_zone: an IANA time zone such as Europe/Paris; empty for the server's own.
    """
    return _now_text(time_zone, "")


def current_time_in(default_zone: str) -> Callable[..., str]:
    """current_time answering in `default_zone` (the config's tools_time_zone) when the call names none; same name,
    docstring and signature, so the same schema. An empty default_zone is the server's own zone."""

    @functools.wraps(current_time)
    def zoned(time_zone: str = "") -> str:
        return _now_text(time_zone, default_zone)

    return zoned


def _now_text(time_zone: str, default_zone: str) -> str:
    zone = time_zone or default_zone
    try:
        now = datetime.now(ZoneInfo(zone)) if zone else datetime.now().astimezone()
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {zone!r}") from None
    return now.strftime("%A %d %B %Y, %H:%M %Z").strip()


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    expression: numbers with + - * / // % ** and parentheses, e.g. (12 + 3) * 4.
    """
    try:
        tree = ast.parse(expression.replace("×", "*").replace("÷", "/").replace("^", "**"), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _eval(tree.body)
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large")
        return _BINARY[type(node.op)](left, right)  # ZeroDivisionError is the tool's error result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")
