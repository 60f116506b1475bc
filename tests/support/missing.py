"""What a test needs and does not find here (a built example, a kit's packages, a browser, a server
binary): one line, a skip on a developer's machine and a failure under CI=true, so CI never passes
without running the test."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(line: str) -> NoReturn:
    """Skips the test with `line`; under CI=true fails it instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(line + "; CI=true makes that a failure")
    pytest.skip(line)
