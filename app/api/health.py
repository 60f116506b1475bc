"""Liveness, readiness and the model list."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from pydantic import BaseModel

from app.api.deps import PrincipalDep, ServicesDep
from app.api.responses import errors, v1_errors
from app.chat.model_choice import list_models as models_of
from app.protocol.schemas import ModelList

# Tags per route: a router's tags add to each route's, and /v1/models listed under both appeared twice in
# Swagger UI.
router = APIRouter()


class Health(BaseModel):
    status: str
    models_ready: bool


@router.get("/healthz", tags=["health"], responses=errors(431))
async def healthz(services: ServicesDep) -> Health:
    """Alive: answers as soon as the server accepts requests, before the model layer has loaded."""
    return Health(status="ok", models_ready=services.models.is_ready)


class Readiness(Health):
    database_ready: bool


@router.get(
    "/readyz",
    tags=["health"],
    responses={
        **errors(431),
        503: {
            "model": Readiness,
            "description": "The model layer is still loading, or the database is out of reach",
        },
    },
)
async def readyz(services: ServicesDep, response: Response) -> Readiness:
    """Ready: the model layer is loaded, so turns start without waiting, and the database answers."""
    models_ready = services.models.is_ready
    database_ready = await services.sessions.storage_ready()
    if not (models_ready and database_ready):
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    state = (
        "ok" if database_ready and models_ready else ("loading" if database_ready else "database_unavailable")
    )
    return Readiness(status=state, models_ready=models_ready, database_ready=database_ready)


@router.get("/v1/models", tags=["models"], responses=v1_errors())
async def list_models(services: ServicesDep, _principal: PrincipalDep) -> ModelList:
    """The demo model and the models file's models, with their resolved context windows."""
    return await models_of(services.settings, services.models)
