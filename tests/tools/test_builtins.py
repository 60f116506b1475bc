"""Tests for app.tools.builtins: current_time and the ast-based calculator, directly and via a registry."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from datetime import UTC, datetime, timedelta

import pytest

from app.tools import ToolContext, ToolOutcome, build_default_registry
from app.tools.builtins import MAX_EXPRESSION_LENGTH, calculate, current_time, evaluate

CTX = ToolContext(session_id="s1", turn_id="t1", tool_call_id="call-1")
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def execute(name: str, arguments: str) -> ToolOutcome:
    registry = build_default_registry()
    return asyncio.run(registry.execute(name, arguments, CTX, default_timeout=5))


# --- current_time -------------------------------------------------------------------------------


def test_current_time_defaults_to_utc_and_is_consistent() -> None:
    result = asyncio.run(current_time())
    assert set(result) == {"time", "timezone", "weekday"}
    assert result["timezone"] == "UTC"
    parsed = datetime.fromisoformat(result["time"])
    assert parsed.utcoffset() == timedelta(0)
    assert abs(parsed - datetime.now(UTC)) < timedelta(seconds=5)
    assert result["weekday"] == WEEKDAYS[parsed.weekday()]


@pytest.mark.parametrize(
    ("zone", "canonical"),
    [("Asia/Kolkata", "Asia/Kolkata"), ("asia/KOLKATA", "Asia/Kolkata"), (" Asia/Kolkata ", "Asia/Kolkata")],
)
def test_current_time_in_named_zone_has_its_offset(zone: str, canonical: str) -> None:
    result = asyncio.run(current_time(zone))
    assert result["timezone"] == canonical
    parsed = datetime.fromisoformat(result["time"])
    assert parsed.utcoffset() == timedelta(hours=5, minutes=30)  # India has no DST: stable offset.
    assert result["weekday"] == WEEKDAYS[parsed.weekday()]


@pytest.mark.parametrize(
    "zone", ["Mars/Olympus_Mons", "", "Europe", "../etc/passwd", "/etc/localtime", "zone.tab"]
)
def test_current_time_refuses_unknown_zones(zone: str) -> None:
    with pytest.raises(ValueError, match=f"^Unknown time zone {re.escape(repr(zone))}"):
        asyncio.run(current_time(zone))


def test_current_time_through_registry() -> None:
    ok = execute("current_time", '{"timezone": "Europe/Paris"}')
    assert not ok.is_error
    assert json.loads(ok.content)["timezone"] == "Europe/Paris"
    assert json.loads(execute("current_time", "").content)["timezone"] == "UTC"

    bad = execute("current_time", '{"timezone": "Nowhere/Land"}')
    assert bad.is_error
    assert bad.content.startswith("Tool 'current_time' refused the call: Unknown time zone 'Nowhere/Land'")


# --- calculator: results ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2+3", "5"),
        ("10/4", "2.5"),
        ("4/2", "2.0"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("2 * 3 ** 2", "18"),
        ("2 ** 3 ** 2", "512"),  # right-associative
        ("-2 ** 2", "-4"),  # power binds tighter than unary minus
        ("-(3 - 5)", "2"),
        ("+4", "4"),
        ("--4", "4"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("7.5 % 2", "1.5"),
        ("2 ** -1", "0.5"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("1e3", "1000.0"),
        ("1_000 * 2", "2000"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("sqrt(16)", "4.0"),
        ("sqrt(2) * sqrt(2)", repr(math.sqrt(2) * math.sqrt(2))),
        ("abs(-3)", "3"),
        ("abs(-2.5)", "2.5"),
        ("round(2.5)", "2"),
        ("round(3.14159, 2)", "3.14"),
        ("round(1234, -2)", "1200"),
        ("min(3, 1, 2)", "1"),
        ("max(1, 2.5)", "2.5"),
        ("max(7)", "7"),
        ("pi", repr(math.pi)),
        ("2 * e", repr(2 * math.e)),
        ("  (1 + 1)  ", "2"),
        ("+".join(["1"] * 200), "200"),  # a long flat sum is not "too deeply nested"
    ],
)
def test_calculator_results(expression: str, expected: str) -> None:
    assert asyncio.run(calculate(expression)) == expected


def test_calculator_keeps_int_and_float_types() -> None:
    assert isinstance(evaluate("6 / 3"), float)
    assert isinstance(evaluate("6 // 3"), int)
    assert isinstance(evaluate("2 ** 10"), int)


# --- calculator: refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        # names, attributes and calls outside the whitelist
        ("x + 1", "name 'x' is not allowed"),
        ("__builtins__", "name '__builtins__' is not allowed"),
        ("sqrt + 1", "'sqrt' is a function"),
        ("(1).real", "not allowed: attribute access"),
        ("math.sqrt(4)", "not allowed: attribute access"),
        ("__import__('os').system('ls')", "not allowed: attribute access"),
        ("__import__('os')", "function '__import__' is not allowed"),
        ("eval('1')", "function 'eval' is not allowed"),
        ("pow(2, 3)", "function 'pow' is not allowed"),
        ("(lambda: 1)()", "only these functions may be called"),
        # other Python syntax
        ("'a' * 3", "str constants are not allowed"),
        ("True + 1", "bool constants are not allowed"),
        ("1j * 1j", "complex constants are not allowed"),
        ("[1, 2]", "not allowed: lists"),
        ("(1, 2)", "not allowed: tuples"),
        ("1 < 2", "not allowed: comparisons"),
        ("1 and 2", "not allowed: 'and'/'or'"),
        ("1 if 1 else 0", "not allowed: conditional expressions"),
        ("(y := 2)", "not allowed: assignment expressions"),
        ("[1][0]", "not allowed: subscripts"),
        ("f'{1}'", "not allowed: f-strings"),
        ("1 << 2", "operator '<<' is not allowed"),
        ("6 & 3", "operator '&' is not allowed"),
        ("~1", "operator '~' is not allowed"),
        ("not 1", "operator 'not' is not allowed"),
        # call shapes
        ("abs(x=1)", "keyword arguments are not allowed"),
        ("min(*[1, 2])", "not allowed: unpacking"),
        ("sqrt(1, 2)", r"sqrt\(\) takes 1 argument\(s\), got 2"),
        ("round()", r"round\(\) takes 1 to 2 argument\(s\), got 0"),
        ("min()", r"min\(\) takes 1 to any number of argument\(s\), got 0"),
        ("round(1.5, 0.5)", "digits must be an integer"),
        ("round(5, -10 ** 100)", "digits must be between"),
        # size and domain guards
        ("9 ** 9 ** 9", "result is too large"),
        ("10 ** 10000", "result is too large"),
        ("2 ** 3999 * 2 ** 3999", "result is too large"),
        ("1.5 ** (10 ** 100)", "result is too large"),
        ("10.0 ** 400", "result is too large"),
        ("1e999", "result is too large"),
        ("10 ** 400 / 3", "result is too large"),
        ("(-8) ** 0.5", "result is not a real number"),
        ("sqrt(-1)", "negative"),
        ("1 / 0", "^division by zero$"),
        ("1 // 0", "^division by zero$"),
        ("1 % 0", "^division by zero$"),
        ("1.0 / 0.0", "^division by zero$"),
        ("0 ** -1", "^division by zero$"),
        # malformed or abusive input
        ("1 +", "invalid syntax"),
        ("", "invalid syntax"),
        ("import os", "invalid syntax"),
        ("1" * (MAX_EXPRESSION_LENGTH + 1), "longer than 500 characters"),
        ("-" * 400 + "1", "too deeply nested"),
        ("(" * 210 + "1" + ")" * 210, "invalid syntax"),
    ],
)
def test_calculator_refusals(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(expression)


def test_a_refused_call_logs_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A refusal is the model's mistake, not the service's: one log line each time, no traceback."""
    with caplog.at_level(logging.DEBUG, logger="app.tools"):
        for _ in range(2):
            assert execute("calculate", '{"expression": "1 / 0"}').is_error
    records = [r for r in caplog.records if r.name.startswith("app.tools")]
    assert len(records) == 2
    assert all(r.exc_info is None and r.levelno < logging.WARNING for r in records)
    assert all(r.getMessage().count("\n") == 0 and "division by zero" in r.getMessage() for r in records)


def test_calculator_through_registry() -> None:
    assert execute("calculate", '{"expression": "(2 + 3) * 4"}') == ToolOutcome("20", is_error=False)

    refused = execute("calculate", '{"expression": "open(\'x\')"}')
    assert refused.is_error
    assert refused.content.startswith("Tool 'calculate' refused the call: function 'open' is not allowed")

    # The length limit is also in the schema, so the model sees it and pydantic enforces it.
    too_long = execute("calculate", json.dumps({"expression": "1" * 501}))
    assert too_long.is_error
    assert "expression: String should have at most 500 characters" in too_long.content
