"""Finding and ending a stdio MCP server's process group (Linux; elsewhere both are no-ops).

The SDK starts each stdio server in a session of its own (its pid is its process group's id) and kills
that group when it closes a server that is still running. A server that died on its own (a crash, a
kill) is past that: its children stay, orphaned. So the MCP task finds the group when the server has
started, by the marker it put in the server's environment, and kills what is left of it when it
leaves the client: at shutdown, before a reconnect, after a crash.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

__all__ = ["MARKER_VARIABLE", "find_group", "kill_group"]

MARKER_VARIABLE = "PARLEY_MCP_SERVER"
logger = logging.getLogger(__name__)


def _children() -> list[int]:
    pids: list[int] = []
    for task in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError):
            pids.extend(int(pid) for pid in task.read_text().split())
    return pids


def find_group(marker: str) -> int | None:
    """The process group of this process's child whose environment carries `marker`."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    for pid in _children():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            with contextlib.suppress(OSError):
                return os.getpgid(pid)
    return None


def kill_group(group: int) -> None:
    """SIGKILL to every process left in the group; nothing if none is."""
    if group <= 1 or group == os.getpgid(0):
        return  # never this process's own group
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        return
    except PermissionError:
        logger.warning("Cannot end MCP server process group %d", group)
        return
    logger.info("Ended what was left of MCP server process group %d", group)
