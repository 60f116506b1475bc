"""The app with one more tool, `slow`, for process tests that need a server busy inside a tool call.

    python -m uvicorn tests.support.slow_app:app

The demo model calls it on "[call:slow {"seconds": N}]".
"""

from __future__ import annotations

import asyncio

from app.main import create_app
from app.tools.registry import build_default_registry

registry = build_default_registry()


@registry.register(name="slow")
async def slow(seconds: float = 0.0) -> str:
    """Waits `seconds`, then says so."""
    await asyncio.sleep(seconds)
    return f"waited {seconds} s"


app = create_app(tools=registry)
