"""Typed dependencies: everything a route needs comes from the lifespan's state, never from module globals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from app.broker import Broker
from app.llm.layer import ModelLayer
from app.service import ChatService
from app.settings import Settings


@dataclass(frozen=True)
class Services:
    settings: Settings
    chat: ChatService
    broker: Broker
    models: ModelLayer


def get_services(request: Request) -> Services:
    services: Services = request.state.services
    return services


def get_chat(request: Request) -> ChatService:
    return get_services(request).chat


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retries with the same key and body get the first answer; with another body, 422.",
    ),
]
ServicesDep = Annotated[Services, Depends(get_services)]
ChatDep = Annotated[ChatService, Depends(get_chat)]
