"""`GET /metrics` (PARLEY_METRICS=1): the Prometheus text format, outside /v1's API keys.

With PARLEY_METRICS_TOKEN set it needs `Authorization: Bearer <that token>` (a scraper's own secret,
compared in constant time); without, anyone who reaches the port may scrape. Not in the published API.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response

from app.api.deps import ServicesDep
from app.errors import Unauthorized
from app.observability.metrics import Metrics

router = APIRouter(include_in_schema=False)


@router.get("/metrics")
async def metrics(
    request: Request,
    services: ServicesDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    token = services.settings.metrics_token
    if token:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise Unauthorized("GET /metrics needs the metrics token: Authorization: Bearer <token>.")
    registry: Metrics = request.state.metrics
    body, content_type = registry.render()
    return Response(body, media_type=content_type)
