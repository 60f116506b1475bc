"""Liveness, readiness and the model list."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from pydantic import BaseModel

from app.api.deps import PrincipalDep, ServicesDep
from app.api.responses import errors, v1_errors
from app.chat.catalog import list_models as models_of
from app.protocol.schemas import ModelList

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str
    models_ready: bool


@router.get("/healthz", responses=errors(431))
async def healthz(services: ServicesDep) -> Health:
    """Alive: answers as soon as the server accepts requests, before the model layer has loaded."""
    return Health(status="ok", models_ready=services.models.is_ready)


@router.get(
    "/readyz",
    responses={**errors(431), 503: {"model": Health, "description": "The model layer is still loading"}},
)
async def readyz(services: ServicesDep, response: Response) -> Health:
    """Ready: the model layer is loaded, so turns start without waiting."""
    ready = services.models.is_ready
    if not ready:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return Health(status="ok" if ready else "loading", models_ready=ready)


@router.get("/v1/models", tags=["models"], responses=v1_errors())
async def list_models(services: ServicesDep, _principal: PrincipalDep) -> ModelList:
    """The demo model and the models file's models, with their resolved context windows."""
    return await models_of(services.settings, services.models)
