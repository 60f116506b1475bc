"""The TypeScript declarations: regenerated from the committed spec they match, and they type-check.

Needs Node.js and npm (CI has them): without them this fails rather than skips, since a contract that is
not checked is not published. `make openapi-deps` installs the pinned tools when they are missing.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from scripts.export_openapi import OPENAPI_DIR, ROOT, SPEC, TYPES, render_types

TSC = OPENAPI_DIR / "node_modules" / ".bin" / "tsc"


@pytest.fixture(scope="module")
def node_tools() -> None:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: the TypeScript contract needs Node.js 20 with npm "
            "(apt-get install nodejs npm), then `make openapi-deps`",
            pytrace=False,
        )
    installed = subprocess.run(["make", "-s", "openapi-deps"], cwd=ROOT, capture_output=True, text=True)
    assert installed.returncode == 0, f"make openapi-deps failed:\n{installed.stdout}\n{installed.stderr}"


@pytest.mark.usefixtures("node_tools")
def test_the_committed_declarations_are_generated_from_the_committed_spec() -> None:
    committed = TYPES.read_text() if TYPES.exists() else ""
    assert committed == render_types(SPEC), (
        f"{TYPES.relative_to(ROOT)} differs from what openapi-typescript makes of "
        f"{SPEC.relative_to(ROOT)}: run `make openapi` and commit it"
    )


@pytest.mark.usefixtures("node_tools")
def test_the_declarations_and_their_example_client_type_check() -> None:
    checked = subprocess.run(
        [str(TSC), "--project", str(OPENAPI_DIR)], cwd=OPENAPI_DIR, capture_output=True, text=True
    )
    assert checked.returncode == 0, f"tsc --noEmit failed:\n{checked.stdout}\n{checked.stderr}"
