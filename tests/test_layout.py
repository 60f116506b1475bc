"""The code's shape, held by a machine: every module of app/ stays under about 400 lines and every
function under about 60 (STYLE.md: past that a module or a function is usually two things)."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(APP.rglob("*.py"))


def test_no_module_is_over_400_lines() -> None:
    long = {
        str(path.relative_to(APP.parent)): n
        for path in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_60_lines() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(APP.parent)}:{node.lineno} {node.name}"] = lines
    assert long == {}
