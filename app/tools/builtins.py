"""Built-in tools that are safe to offer any session: the current time and an arithmetic calculator.

This module owns those two tools, listed in `BUILTINS`: plain `async def` functions, which the registry
(registry.py `build_default_registry`) turns into tools. Neither tool touches the network, the filesystem
(beyond the time zone database) or `eval`; the calculator works on a whitelisted `ast` and bounds the size
of every number it produces, because its input is written by the model and, through it, by users.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import warnings
import zoneinfo
from collections.abc import Callable
from datetime import datetime
from typing import Annotated

from pydantic import Field

from app.tools.context import ToolRefused

__all__ = [
    "BUILTINS",
    "MAX_EXPRESSION_LENGTH",
    "calculate",
    "current_time",
    "evaluate",
    "format_number",
]

MAX_EXPRESSION_LENGTH = 500
# Integers stay exact, but are bounded: ~1200 digits keeps every operation fast and stays below
# Python's int-to-str conversion limit (4300 digits).
_MAX_INT_BITS = 4000
# The evaluator recurses once per nesting level; this bounds its stack use well below the recursion
# limit while still allowing a sum of ~250 terms (a left-nested chain of BinOps).
_MAX_DEPTH = 300
_MAX_ROUND_DIGITS = 100

Number = int | float

# ast.Pow is not here: _power checks the result size before computing it.
_BIN_OPS: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise ToolRefused("round() digits must be an integer")
    # round(5, -10**100) would compute 10**(10**100).
    if abs(ndigits) > _MAX_ROUND_DIGITS:
        raise ToolRefused(f"round() digits must be between -{_MAX_ROUND_DIGITS} and {_MAX_ROUND_DIGITS}")
    return round(x, ndigits)


def _sqrt(x: Number) -> float:
    if x < 0:
        raise ToolRefused("sqrt() of a negative number")
    return math.sqrt(x)


# name -> (function, minimum argument count, maximum argument count or None for unbounded)
_FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int | None]] = {
    "sqrt": (_sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (lambda *args: min(args), 1, None),
    "max": (lambda *args: max(args), 1, None),
}

# Friendlier names than the ast class names, for the refusals the model reads.
_NODE_NAMES: dict[type[ast.AST], str] = {
    ast.Attribute: "attribute access",
    ast.Subscript: "subscripts",
    ast.Compare: "comparisons",
    ast.BoolOp: "'and'/'or'",
    ast.IfExp: "conditional expressions",
    ast.Lambda: "lambda",
    ast.NamedExpr: "assignment expressions",
    ast.List: "lists",
    ast.Tuple: "tuples",
    ast.Set: "sets",
    ast.Dict: "dicts",
    ast.JoinedStr: "f-strings",
    ast.Starred: "unpacking with *",
}
_OP_SYMBOLS: dict[type[ast.AST], str] = {
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}


def _op_name(op: ast.AST) -> str:
    return f"'{_OP_SYMBOLS[type(op)]}'" if type(op) in _OP_SYMBOLS else type(op).__name__


def _checked(value: Number) -> Number:
    """Refuse results that would make later steps slow (huge ints) or meaningless (inf)."""
    if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        raise ToolRefused("result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolRefused("result is too large" if math.isinf(value) else "result is not a number")
    return value


def _power(base: Number, exponent: Number) -> Number:
    # Estimate an exact power's size before computing it: 9**9**9 must be refused, not attempted.
    exact = isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1
    if exact and exponent * math.log2(abs(base)) > _MAX_INT_BITS:
        raise ToolRefused("result is too large (exponent too big)")
    result: object = base**exponent
    if not isinstance(result, int | float):  # complex, as in (-8) ** 0.5
        raise ToolRefused("result is not a real number")
    return result


def _call(node: ast.Call, depth: int) -> Number:
    allowed = ", ".join(_FUNCTIONS)
    if isinstance(node.func, ast.Attribute):
        raise ToolRefused("not allowed: attribute access")
    if not isinstance(node.func, ast.Name):
        raise ToolRefused(f"only these functions may be called: {allowed}")
    fname = node.func.id
    if fname not in _FUNCTIONS:
        raise ToolRefused(f"function '{fname}' is not allowed (allowed: {allowed})")
    if node.keywords:
        raise ToolRefused("keyword arguments are not allowed")
    func, min_args, max_args = _FUNCTIONS[fname]
    if len(node.args) < min_args or (max_args is not None and len(node.args) > max_args):
        expected = str(min_args) if min_args == max_args else f"{min_args} to {max_args or 'any number of'}"
        raise ToolRefused(f"{fname}() takes {expected} argument(s), got {len(node.args)}")
    return func(*(_eval(arg, depth + 1) for arg in node.args))


def _eval(node: ast.AST, depth: int) -> Number:  # noqa: C901 - one flat dispatch over node types
    if depth > _MAX_DEPTH:
        raise ToolRefused("expression is too deeply nested")
    if isinstance(node, ast.Constant):
        # bool is an int subclass; True + True is not arithmetic the model should rely on.
        if isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return _checked(node.value)
        raise ToolRefused(f"{type(node.value).__name__} constants are not allowed, only numbers")
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        if type(node.op) not in _BIN_OPS:
            raise ToolRefused(f"operator {_op_name(node.op)} is not allowed")
        return _checked(_BIN_OPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, depth + 1)
        if isinstance(node.op, ast.USub):
            return -operand
        if isinstance(node.op, ast.UAdd):
            return +operand
        raise ToolRefused(f"operator {_op_name(node.op)} is not allowed")
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if node.id in _FUNCTIONS:
            raise ToolRefused(f"'{node.id}' is a function: call it, e.g. {node.id}(...)")
        raise ToolRefused(f"name '{node.id}' is not allowed (allowed constants: {', '.join(_CONSTANTS)})")
    if isinstance(node, ast.Call):
        return _checked(_call(node, depth))
    raise ToolRefused(f"not allowed: {_NODE_NAMES.get(type(node), type(node).__name__)}")


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression without `eval`; raises ToolRefused explaining any refusal."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise ToolRefused(f"expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        # The parser warns about things like invalid escapes in strings; those are refused anyway,
        # and a warning must not escape into the caller (tests turn warnings into errors).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolRefused(f"invalid syntax: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ToolRefused("expression is too deeply nested") from None
    try:
        return _eval(tree.body, 0)
    except ZeroDivisionError:
        raise ToolRefused("division by zero") from None
    except OverflowError:
        raise ToolRefused("result is too large") from None


def format_number(value: Number) -> str:
    """Integers exactly ("5"), floats with the shortest exact repr ("2.5", "0.1")."""
    return str(value) if isinstance(value, int) else repr(value)


async def calculate(
    expression: Annotated[
        str,
        Field(
            max_length=MAX_EXPRESSION_LENGTH,
            description="e.g. '(2 + 3) * sqrt(16) / 7'. Operators: + - * / // % **; "
            "functions: sqrt, abs, round, min, max; constants: pi, e.",
        ),
    ],
) -> str:
    """Evaluate an arithmetic expression.

    Exact integer arithmetic; floats for division and functions. No variables or other Python.
    """
    return format_number(evaluate(expression))


_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


@functools.cache
def _zone_names() -> dict[str, str]:
    """Lower-cased IANA name -> canonical name. Cached: listing zones walks the filesystem."""
    return {name.lower(): name for name in zoneinfo.available_timezones()}


async def current_time(
    timezone: Annotated[
        str, Field(description="IANA time zone name, e.g. 'Europe/Paris', 'America/New_York', 'UTC'.")
    ] = "UTC",
) -> dict[str, str]:
    """Current date and time in an IANA time zone."""
    # Looking the name up in the known list (rather than trusting ZoneInfo with it) refuses paths
    # like '../x' or 'zone.tab' cleanly, and forgives case: models write 'europe/paris'.
    name = _zone_names().get(timezone.strip().lower())
    if name is None:
        raise ToolRefused(
            f"Unknown time zone '{timezone}'. Use an IANA name such as 'Europe/Paris' or 'UTC'."
        )
    now = datetime.now(zoneinfo.ZoneInfo(name))
    # Not strftime("%A"): that follows the process locale, and the model expects English names.
    weekday = _WEEKDAYS[now.weekday()]
    return {"time": now.isoformat(timespec="seconds"), "timezone": name, "weekday": weekday}


BUILTINS = (current_time, calculate)
