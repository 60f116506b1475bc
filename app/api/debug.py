"""The benchmark's statistics (PARLEY_DEBUG_STATS=1): read and reset; not part of the published API."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.api.deps import PrincipalDep
from app.observability.monitor import DebugStats

router = APIRouter(include_in_schema=False)


def _stats(request: Request) -> DebugStats:
    stats: DebugStats = request.state.debug_stats
    return stats


@router.get("/debug/stats")
async def debug_stats(request: Request, _principal: PrincipalDep) -> dict[str, Any]:
    return _stats(request).snapshot()


@router.post("/debug/stats/reset")
async def reset_debug_stats(request: Request, _principal: PrincipalDep) -> dict[str, Any]:
    stats = _stats(request)
    stats.reset()
    return stats.snapshot()
