"""List the modules of app/ past ~400 lines and the functions past ~60: places worth a look.

Size is a signal, never a reason to split (STYLE.md): if a long module holds two things that change for
different reasons, split it at that seam; if it is one thing, let it be long. This prints; it fails nothing.
Usage: python scripts/sizes.py [--modules N] [--functions N]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=400, help="module length worth a look (lines)")
    parser.add_argument("--functions", type=int, default=60, help="function length worth a look (lines)")
    args = parser.parse_args()
    modules: list[tuple[int, str]] = []
    functions: list[tuple[int, str]] = []
    for path in sorted(APP.rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(APP.parent))
        if (n := len(text.splitlines())) > args.modules:
            modules.append((n, name))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > args.functions:
                    functions.append((lines, f"{name}:{node.lineno} {node.name}"))
    print(f"modules over {args.modules} lines: {len(modules)}")
    for n, name in sorted(modules, reverse=True):
        print(f"  {n:5d}  {name}")
    print(f"functions over {args.functions} lines: {len(functions)}")
    for n, name in sorted(functions, reverse=True):
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
