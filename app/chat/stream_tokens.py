"""Stream tokens: short-lived tokens the service signs, each opening one session's event stream.

`POST /v1/sessions/{session_id}/stream_token` gives one to the session's owner; a browser's EventSource
then passes it as `?access_token=`, so its URL carries no long-lived credential. A stream token is an
HS256 JWT (header `typ: parley-stream`) naming its principal and session; it opens a stream until it
expires, and a stream it opened goes on after that. Anywhere else (another session, another route, the
Authorization header) it is refused.

The signing key is derived from PARLEY_STREAM_TOKEN_SECRET or, unset, from a random secret the first
replica stores in the database (`service_secrets`): every replica of a deployment shares it.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import jwt

from app.errors import InvalidToken
from app.observability.hooks import auth_failed
from app.settings import Settings
from app.storage import repository
from app.storage.engine import Database

STREAM_TOKEN_TYPE = "parley-stream"
_AUDIENCE = "parley:stream"
_SECRET_NAME = "stream_tokens"
_KEY_LABEL = b"parley stream tokens v1"


@dataclass(frozen=True)
class IssuedStreamToken:
    token: str
    expires_at: str


def is_stream_token(token: str) -> bool:
    """Whether `token` says it is a stream token (unverified: it only picks the check)."""
    if token.count(".") != 2:
        return False
    try:
        return bool(jwt.get_unverified_header(token).get("typ") == STREAM_TOKEN_TYPE)
    except jwt.PyJWTError:
        return False


class StreamTokens:
    def __init__(self, settings: Settings, database: Database) -> None:
        self._settings = settings
        self._database = database
        self._seconds = settings.stream_token_seconds
        self._key: bytes | None = None

    async def _signing_key(self) -> bytes:
        """Read at the first use, not at start: a server starts while PostgreSQL is out of reach."""
        if self._key is None:
            secret = await stream_token_secret(self._settings, self._database)
            # Derived, so that this key is never the secret itself, whatever else the secret is used for.
            self._key = hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()
        return self._key

    async def issue(self, principal: str, session_id: str) -> IssuedStreamToken:
        key = await self._signing_key()
        now = time.time()
        expires = math.ceil(now + self._seconds)
        claims = {"sub": principal, "sid": session_id, "aud": _AUDIENCE, "iat": int(now), "exp": expires}
        token = jwt.encode(claims, key, algorithm="HS256", headers={"typ": STREAM_TOKEN_TYPE})
        at = datetime.fromtimestamp(expires, UTC).isoformat().replace("+00:00", "Z")
        return IssuedStreamToken(token=token, expires_at=at)

    async def open(self, token: str, session_id: str) -> str:
        """The principal the token was issued to, if it opens `session_id`'s stream now."""
        key = await self._signing_key()
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["HS256"],
                audience=_AUDIENCE,
                options={"require": ["exp", "sub", "sid"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise _refuse("The stream token has expired: ask for another.", "expired") from exc
        except jwt.PyJWTError as exc:
            raise _refuse("The stream token is not valid.", "signature") from exc
        if claims.get("sid") != session_id or not isinstance(claims.get("sub"), str):
            raise _refuse("The stream token opens another session's stream.", "stream_token")
        principal: str = claims["sub"]
        return principal


def _refuse(message: str, reason: str) -> InvalidToken:
    auth_failed(reason)
    return InvalidToken(message, reason=reason)


async def stream_token_secret(settings: Settings, database: Database) -> bytes:
    """PARLEY_STREAM_TOKEN_SECRET, or the deployment's stored secret (the first replica to ask makes it)."""
    if settings.stream_token_secret:
        return settings.stream_token_secret.encode()
    async with database.session() as db:
        value = await repository.service_secret(db, _SECRET_NAME, secrets.token_hex(32))
        await db.commit()
    return value.encode()
