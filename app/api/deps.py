"""Typed dependencies: everything a route needs comes from the lifespan's state, never from module globals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from fastapi.security import APIKeyQuery, HTTPAuthorizationCredentials, HTTPBearer

from app.chat.auth import OPEN_PRINCIPAL, KeyRing
from app.chat.branches import Branches
from app.chat.files import Files
from app.chat.idempotency import KEY_PATTERN, MAX_KEY_LENGTH
from app.chat.kit_chats import KitChats
from app.chat.limits import MessageLimit, StreamLimit
from app.chat.messages import Messages
from app.chat.sessions import Sessions
from app.chat.stream_tokens import is_stream_token
from app.chat.tokens import JwtVerifier, looks_like_jwt, refuse
from app.chat.tool_answers import ToolAnswers
from app.chat.turn_view import Turns
from app.errors import InvalidRequest, Unauthorized
from app.llm.gateway import ModelGateway
from app.observability.hooks import auth_failed
from app.settings import Settings
from app.streaming.broker import EventFanOut
from app.tools.catalog import ToolCatalog


@dataclass(frozen=True)
class Services:
    settings: Settings
    sessions: Sessions
    messages: Messages
    turns: Turns
    answers: ToolAnswers
    broker: EventFanOut
    models: ModelGateway
    keys: KeyRing
    # Bearer JWTs, when PARLEY_JWT_SECRET or PARLEY_JWT_JWKS_URL is set.
    tokens: JwtVerifier | None
    message_rate: MessageLimit
    streams: StreamLimit
    tools: ToolCatalog
    branches: Branches
    files: Files
    kits: KitChats


# Async on purpose: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request.
async def get_services(request: Request) -> Services:
    services: Services = request.state.services
    return services


async def get_sessions(request: Request) -> Sessions:
    return (await get_services(request)).sessions


async def get_messages(request: Request) -> Messages:
    return (await get_services(request)).messages


async def get_turns(request: Request) -> Turns:
    return (await get_services(request)).turns


async def get_files(request: Request) -> Files:
    return (await get_services(request)).files


async def get_answers(request: Request) -> ToolAnswers:
    return (await get_services(request)).answers


async def get_branches(request: Request) -> Branches:
    return (await get_services(request)).branches


ServicesDep = Annotated[Services, Depends(get_services)]
ToolAnswersDep = Annotated[ToolAnswers, Depends(get_answers)]
SessionsDep = Annotated[Sessions, Depends(get_sessions)]
MessagesDep = Annotated[Messages, Depends(get_messages)]
TurnsDep = Annotated[Turns, Depends(get_turns)]
BranchesDep = Annotated[Branches, Depends(get_branches)]
FilesDep = Annotated[Files, Depends(get_files)]

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    bearerFormat="API key or JWT",
    description="`Authorization: Bearer <credential>`: a key of PARLEY_API_KEYS or PARLEY_API_KEYS_FILE, "
    "or, when PARLEY_JWT_SECRET or PARLEY_JWT_JWKS_URL is set, a JWT of the identity provider "
    "(docs/auth.md). Not required when the server runs without keys or tokens.",
)
_access_token = APIKeyQuery(
    name="access_token",
    auto_error=False,
    scheme_name="AccessToken",
    description="For the event stream only (EventSource cannot set headers): a stream token of POST "
    ".../stream_token, which opens this one session's stream for a few minutes, or the same key or JWT "
    "as the header. URLs end up in histories and proxy logs: prefer stream tokens, over TLS.",
)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


# The event stream's refusals also name `?access_token=`: EventSource cannot send the header, and a
# browser that gets a 401 just closes its EventSource (readyState 2) without saying why.
_STREAM_HINT = (
    " An EventSource, which cannot send headers, passes the key as `?access_token=<key>`, or a stream "
    "token of POST .../stream_token in its place."
)


async def _identify(services: Services, credential: str | None, *, stream: bool = False) -> str:
    """The principal of a key, or of a JWT when tokens are configured; 401 for anything else."""
    if services.keys.is_open:
        return OPEN_PRINCIPAL
    hint = _STREAM_HINT if stream else ""
    wanted = "An API key or a token" if services.tokens is not None else "An API key"
    if not credential:
        auth_failed("missing")
        raise Unauthorized(f"{wanted} is required: send `Authorization: Bearer <credential>`." + hint)
    principal = services.keys.identify(credential)
    if principal is not None:
        return principal
    if is_stream_token(credential):
        raise refuse(
            "A stream token opens its session's event stream only, as `?access_token=`.", "stream_token"
        )
    if services.tokens is not None and looks_like_jwt(credential):
        return await services.tokens.principal(credential)
    auth_failed("key")
    raise Unauthorized(f"The {'API key or token' if services.tokens else 'API key'} is not valid." + hint)


async def get_principal(services: ServicesDep, credentials: BearerDep) -> str:
    """The caller's principal: the owner of its bearer key or token ("" when the server is open)."""
    return await _identify(services, credentials.credentials if credentials else None)


async def get_stream_principal(
    session_id: str,
    services: ServicesDep,
    credentials: BearerDep,
    access_token: Annotated[str | None, Depends(_access_token)],
) -> str:
    """As get_principal, also accepting `?access_token=`: a stream token of this session, or a key or
    token; the header wins when both are sent."""
    if credentials is None and access_token and not services.keys.is_open and is_stream_token(access_token):
        return await services.sessions.open_stream(access_token, session_id)
    return await _identify(services, credentials.credentials if credentials else access_token, stream=True)


PrincipalDep = Annotated[str, Depends(get_principal)]
StreamPrincipalDep = Annotated[str, Depends(get_stream_principal)]


async def get_message_poster(services: ServicesDep, principal: PrincipalDep) -> str:
    """The caller's principal, once a message of its per-minute allowance is spent (else 429)."""
    await services.message_rate.take(principal)
    return principal


MessagePosterDep = Annotated[str, Depends(get_message_poster)]

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=KEY_PATTERN,
        max_length=MAX_KEY_LENGTH,
        description="1 to 255 printable ASCII characters, yours (a UUID is a good key), kept for "
        "PARLEY_IDEMPOTENCY_TTL_HOURS per principal. A retry with the same key and body gets the first "
        "answer (header `Idempotent-Replayed: true`); requests racing with one key all get the first "
        "one's answer, a refusal included. A refusal (4xx) stores nothing and frees the key. The same key "
        "with another body (or on another route): 422 `idempotency_key_reused`.",
    ),
]


METADATA_PREFIX = "metadata."
# The list's filter parameters are named by the metadata's keys: OpenAPI has no pattern for a
# parameter's name, so the spec shows one parameter whose name stands for all of them.
METADATA_FILTER_NAME = METADATA_PREFIX + "{key}"
METADATA_FILTER_PARAMETER: dict[str, Any] = {
    "name": METADATA_FILTER_NAME,
    "in": "query",
    "required": False,
    "schema": {"type": "string"},
    "description": "`metadata.<key>=<value>` (e.g. `metadata.project=apollo`): only the sessions whose "
    "metadata has the top-level `<key>` with this value: a string as is, a number or boolean as JSON "
    "writes it (`metadata.pinned=true`, `metadata.rank=3`). Repeat with other keys: each narrows the list.",
}


class MetadataFilter:
    """The `metadata.<key>=<value>` query parameters, as (key, value) pairs (a key no session holds, or a
    key given twice with two values, matches nothing)."""

    async def __call__(self, request: Request) -> list[tuple[str, str]]:
        return [
            (name.removeprefix(METADATA_PREFIX), value)
            for name, value in request.query_params.multi_items()
            if name.startswith(METADATA_PREFIX)
        ]


async def known_query_only(request: Request) -> None:
    """A query parameter the operation does not declare is a 422, as an unknown body field is: a typo
    (`?wiat=true`) must not be silently ignored. The declared ones are read from the route's dependencies,
    the source FastAPI builds the spec's parameters from (tests/api/test_bad_requests.py checks that both
    agree for every route): building the whole spec here made each process's first request ~0.2 s."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    # Per app (its routes' dependants live as long as it does), by the route's dependant.
    cache: dict[int, frozenset[str]] | None = getattr(request.app.state, "query_names", None)
    if cache is None:
        cache = request.app.state.query_names = {}
    known = cache.get(id(dependant))
    if known is None:
        known = cache[id(dependant)] = _query_names(dependant)
    for name in request.query_params:
        # access_token is a credential: where the route does not take it, the caller gets the 401 of a
        # request without a key, as before this check.
        if name.startswith(METADATA_PREFIX) and METADATA_FILTER_NAME in known:
            continue
        if name not in known and name != "access_token":
            raise InvalidRequest(f"query.{name[:100]}", "not a parameter of this route", "extra_forbidden")


def _query_names(dependant: Any) -> frozenset[str]:
    """The query parameters a route declares, its dependencies' and an API key read from the query
    included."""
    declared = {param.alias for param in dependant.query_params}
    if isinstance(dependant.call, APIKeyQuery):
        declared.add(dependant.call.model.name)
    if isinstance(dependant.call, MetadataFilter):
        declared.add(METADATA_FILTER_NAME)
    for sub in dependant.dependencies:
        declared |= _query_names(sub)
    return frozenset(declared)
