"""The fuzz run's fresh seed, printed so that a failure can be replayed with PARLEY_FUZZ_SEED=<seed>: in the
report header (shown without -q) and in the terminal summary (shown with -q too)."""

from __future__ import annotations

import pytest


def _seed_line() -> str:
    from tests.fuzz.test_schemathesis import FRESH_SEED, REPLAY

    return f"schemathesis fresh seed: {FRESH_SEED} ({REPLAY})"


def pytest_report_header(config: pytest.Config) -> str:
    return _seed_line()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(_seed_line())
