"""The `slow` tool a test controls, for live servers that need a turn to stay inside a tool call.

A call waits a number of seconds or for a gate the test opens from its own thread (the server runs its
event loop in another thread, so `release` hands the wake-up to that loop), and records whether it
finished or was cancelled. The demo model calls it for `[call:slow {"gate": ...}]`; the strict upstream
of tests/interrupt/ calls it by its script.

A pytest plugin (tests/conftest.py registers it): the `slow_tool` fixture is one fresh tool per test whose
gates are all opened at its end; `build_registry(slow_tool)` is what a live server is given as `tools`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from app.tools.registry import ToolRegistry, build_default_registry


@dataclass
class _Gate:
    opened: bool = False
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)


@dataclass
class SlowTool:
    """State of the `slow` tool, shared between the server thread and the test (thread-safe).

    A call waiting on a gate awaits an asyncio.Event of the server's loop; `release` (from the test's
    thread) sets it through `loop.call_soon_threadsafe`."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _gates: dict[str, _Gate] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def release(self, name: str) -> None:
        """Lets every call waiting on `name` (now or later) finish."""
        with self._lock:
            gate = self._gates.setdefault(name, _Gate())
            gate.opened, waiters, gate.waiters = True, gate.waiters, []
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # the server's loop is already closed
                loop.call_soon_threadsafe(event.set)

    def release_all(self) -> None:
        with self._lock:
            names = list(self._gates)
        for name in names:
            self.release(name)

    async def _wait(self, name: str) -> None:
        with self._lock:
            gate = self._gates.setdefault(name, _Gate())
            if gate.opened:
                return
            event = asyncio.Event()
            gate.waiters.append((asyncio.get_running_loop(), event))
        await event.wait()

    def _log(self, where: list[str], label: str) -> None:
        with self._lock:
            where.append(label)

    async def run(self, seconds: float, gate: str) -> str:
        label = gate or f"{seconds}s"
        self._log(self.started, label)
        try:
            await (self._wait(gate) if gate else asyncio.sleep(seconds))
        except asyncio.CancelledError:
            self._log(self.cancelled, label)
            raise
        self._log(self.finished, label)
        return f"slow done: {label}"


def build_registry(slow: SlowTool) -> ToolRegistry:
    registry = build_default_registry()

    @registry.register(name="slow")
    async def slow_tool(seconds: float = 0.0, gate: str = "") -> str:
        """Waits `seconds`, or until the test opens `gate`."""
        return await slow.run(seconds, gate)

    return registry


@pytest.fixture
def slow_tool() -> Iterator[SlowTool]:
    tool = SlowTool()
    yield tool
    tool.release_all()  # never leave a server thread polling a gate nobody will open
