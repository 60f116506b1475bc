"""app/tools/external.py and app/tools/process_group.py: names cleaned to what providers accept, the
result cap's marker, and a stdio server's process group found by its marker and ended."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import pytest

from app.tools.context import ToolContext, ToolOutcome
from app.tools.external import ExternalTool, cap_result, clean_name, run_external
from app.tools.process_group import MARKER_VARIABLE, find_group, kill_group
from tests.support.mcp import alive

CTX = ToolContext(session_id="s", turn_id="t", tool_call_id="c")


@pytest.mark.parametrize(
    ("raw", "cleaned"),
    [
        ("github__create_issue", "github__create_issue"),
        ("files__read.file", "files__read_file"),
        ("srv__ünïcode tool/x", "srv___n_code_tool_x"),
        ("srv__...", "srv"),
    ],
)
def test_clean_name(raw: str, cleaned: str) -> None:
    assert clean_name(raw) == cleaned


def test_a_long_name_keeps_a_hash_and_stays_unique() -> None:
    a, b = clean_name("s__" + "a" * 80), clean_name("s__" + "a" * 81)
    assert len(a) == 64 and a != b and re.fullmatch(r"^[a-zA-Z0-9_-]{1,64}$", a)


def test_cap_result() -> None:
    assert cap_result("short", 10) == ("short", False)
    text, cut = cap_result("x" * 25, 10)
    assert (
        cut and text == "x" * 10 + "\n[truncated: the result had 25 characters; only the first 10 are shown]"
    )


def test_a_tool_that_raises_or_overruns_is_an_error_result() -> None:
    async def boom(arguments: dict[str, object], ctx: ToolContext) -> ToolOutcome:
        raise RuntimeError("secret detail")

    async def hang(arguments: dict[str, object], ctx: ToolContext) -> ToolOutcome:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    schema = {"type": "object", "properties": {}}
    failing = ExternalTool("boom", "d", schema, "http", boom)
    slow = ExternalTool("hang", "d", schema, "mcp", hang, timeout=0.05)
    assert asyncio.run(run_external(failing, "{}", CTX)) == ToolOutcome(
        "Tool 'boom' failed: RuntimeError", is_error=True
    )
    assert asyncio.run(run_external(slow, "", CTX)).content == "Tool 'hang' timed out after 0.05 s"
    assert asyncio.run(run_external(failing, "[1]", CTX)).content.endswith("must be a JSON object")


def test_the_group_is_found_by_its_marker_and_ended() -> None:
    env = {**os.environ, MARKER_VARIABLE: "srv-1234"}
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); time.sleep(60)",
        ],
        env=env,
        start_new_session=True,
    )
    try:
        assert find_group("srv-other") is None
        for _ in range(100):
            if find_group("srv-1234") == leader.pid:
                break
        assert find_group("srv-1234") == leader.pid
        kill_group(leader.pid)
        leader.wait(timeout=10)
        kill_group(leader.pid)  # nothing left: no error
        assert not alive(leader.pid)
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()
