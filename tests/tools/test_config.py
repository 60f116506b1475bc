"""The tools file (app/tools/config.py): what it accepts, and that every bad entry is one line that names
the entry and what is wrong, never a value (a secret once expanded) and never a traceback, also from
`python -m app` itself, which exits before it serves.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.tools.config import ToolsConfigError, load_tools_config, parse_tools_config
from tests.support.server import ROOT

SECRET = "very-secret-value-0123456789"

GOOD_YAML = """
mcp_servers:
  github:
    url: https://mcp.example.com/mcp
    headers: {Authorization: "Bearer ${PARLEY_TEST_TOKEN}"}
    approval: ["create_*", delete_issue]
  files:
    command: python
    args: [-m, files_server]
    env: {ROOT: /srv}
    timeout: 20
http_tools:
  lookup_order:
    url: https://orders.example.com/tool
    description: Look an order up.
    parameters: {type: object, properties: {number: {type: string}}, required: [number]}
    secret: ${PARLEY_TEST_SECRET}
    approval: always
allow_private_hosts: [127.0.0.1]
"""


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_TEST_TOKEN", SECRET)
    monkeypatch.setenv("PARLEY_TEST_SECRET", SECRET)


def test_a_full_file_in_yaml_and_in_json(tmp_path: Path) -> None:
    config = parse_tools_config(GOOD_YAML)
    assert config.mcp_servers["github"].headers == {"Authorization": f"Bearer {SECRET}"}
    assert config.mcp_servers["github"].transport == "http"
    assert config.mcp_servers["files"].transport == "stdio" and config.mcp_servers["files"].timeout == 20
    assert config.mcp_servers["github"].timeout == 60  # the default per-call timeout
    assert config.http_tools["lookup_order"].secret == SECRET
    path = tmp_path / "tools.json"
    path.write_text(
        '{"http_tools": {"t": {"url": "https://x.example/t", "description": "d",'
        ' "secret": "${PARLEY_TEST_SECRET}"}}}'
    )
    assert load_tools_config(path).http_tools["t"].parameters == {"type": "object", "properties": {}}
    assert load_tools_config(None).mcp_servers == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mcp_servers: {gh: {url: 'https://x', command: y}}", "mcp_servers.gh: give either url"),
        ("mcp_servers: {gh: {}}", "mcp_servers.gh: give either url (streamable HTTP) or command (stdio)"),
        ("mcp_servers: {gh: {url: 'ftp://x'}}", "mcp_servers.gh: url must be an http:// or https:// URL"),
        ("mcp_servers: {gh: {command: x, headers: {a: b}}}", "headers are for url servers only"),
        (
            "mcp_servers: {gh: {url: 'https://x', timeout: 0}}",
            "mcp_servers.gh.timeout: Input should be greater",
        ),
        ("mcp_servers: {'a b': {url: 'https://x'}}", "mcp_servers.a b.[key]: String should match pattern"),
        (
            "mcp_servers: {gh: {url: 'https://x', token: 1}}",
            "mcp_servers.gh.token: Extra inputs are not permitted",
        ),
        (
            "http_tools: {t: {url: 'http://example.com/t', description: d, secret: '${PARLEY_TEST_SECRET}'}}",
            "http_tools.t.url: url must be an https:// URL",
        ),
        (
            "http_tools: {t: {url: 'https://x/t', description: d, secret: short}}",
            "http_tools.t.secret: String should have at least 16 characters",
        ),
        (
            "http_tools: {t: {url: 'https://x/t', description: d, secret: '${PARLEY_TEST_SECRET}',"
            " parameters: {type: object, properties: {n: {type: 7}}}}}",
            "http_tools.t.parameters: parameters is not a valid JSON schema",
        ),
        (
            "http_tools: {t: {url: 'https://x/t', description: d, secret: '${NOT_SET_ANYWHERE}'}}",
            "http_tools.t.secret: environment variable NOT_SET_ANYWHERE is not set",
        ),
        ("- a list", "must hold a mapping"),
        ("mcp_servers: {gh: [unclosed", "is not valid YAML or JSON at line 1"),
    ],
)
def test_a_bad_entry_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(ToolsConfigError) as raised:
        parse_tools_config(text)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value) and SECRET not in str(raised.value)


def test_a_secret_in_a_bad_entry_is_never_shown() -> None:
    text = (
        "http_tools: {t: {url: 'https://x/t', description: d, secret: '${PARLEY_TEST_SECRET}', timeout: -1}}"
    )
    with pytest.raises(ToolsConfigError) as raised:
        parse_tools_config(text)
    assert "http_tools.t.timeout" in str(raised.value) and SECRET not in str(raised.value)


def test_python_m_app_stops_with_one_line(tmp_path: Path) -> None:
    """A real `python -m app`: exit 2 before it binds, one line on stderr, no traceback, no secret."""
    path = tmp_path / "tools.yaml"
    path.write_text(
        "mcp_servers:\n  gh:\n    url: 'https://x/mcp'\n"
        "    headers: {Authorization: 'Bearer ${PARLEY_TEST_TOKEN}'}\n    command: oops\n"
    )
    env = {
        **os.environ,
        "PARLEY_TOOLS_FILE": str(path),
        "PARLEY_DATABASE_URL": "sqlite+aiosqlite:///:memory:",
    }
    done = subprocess.run(
        [sys.executable, "-m", "app", "--port", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    what = "mcp_servers.gh: give either url (streamable HTTP) or command (stdio)"
    assert done.stderr.strip().splitlines() == [f"parley: PARLEY_TOOLS_FILE {path}: {what}"]
    assert SECRET not in done.stderr + done.stdout and "Traceback" not in done.stderr
    path.unlink()
    done = subprocess.run(
        [sys.executable, "-m", "app", "--port", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.strip() == (
        f"parley: PARLEY_TOOLS_FILE {path} cannot be read: No such file or directory"
    )
