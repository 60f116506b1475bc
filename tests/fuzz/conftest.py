"""The fuzz run's fresh seed, in the report header: a failure is replayed with PARLEY_FUZZ_SEED=<seed>."""

from __future__ import annotations

import pytest


def pytest_report_header(config: pytest.Config) -> str:
    from tests.fuzz.test_schemathesis import FRESH_SEED, REPLAY

    return f"schemathesis fresh seed: {FRESH_SEED} ({REPLAY})"
