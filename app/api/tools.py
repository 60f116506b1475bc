"""GET /v1/tools: what a session may choose."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import PrincipalDep, ServicesDep
from app.api.responses import v1_errors
from app.protocol.tools import ToolList

router = APIRouter(tags=["tools"])


@router.get("/v1/tools", responses=v1_errors())
async def list_tools(services: ServicesDep, _principal: PrincipalDep) -> ToolList:
    """Every tool a session may choose (built-in, MCP, HTTP) with its schema, and each MCP server's state."""
    return ToolList.model_validate(services.tools.listing())
