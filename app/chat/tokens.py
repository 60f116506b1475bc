"""Bearer JWTs of an identity provider or of the product's own backend (docs/auth.md).

PyJWT does the cryptography; this module decides which key and which algorithms a token is checked with,
and what its principal is. The algorithm is always one of the configured list (PARLEY_JWT_ALGORITHMS) and
picks the kind of key: an HMAC algorithm is checked only with PARLEY_JWT_SECRET, any other only with a
JWKS key of its own type, so neither `alg: none` nor an HS256 token signed with a public key passes.

A refusal is an `InvalidToken` whose reason names the check that failed (one of `REASONS`, also the
label of the auth failure metric) and whose message never shows a piece of the token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import jwt

from app.chat.auth import HMAC_ALGORITHMS, JwtConfig
from app.chat.stream_tokens import STREAM_TOKEN_TYPE
from app.errors import InvalidToken, Unavailable
from app.observability.hooks import auth_failed

log = logging.getLogger("parley")

# Longer tokens are refused before any parsing: a JWT of an identity provider is well under 4 KB.
MAX_TOKEN_BYTES = 8192
# A principal column holds 100 characters (app.storage.tables).
MAX_PRINCIPAL = 100
PRINCIPAL_PREFIX = "jwt:"
MAX_JWKS_BYTES = 1_000_000
# The key types each asymmetric algorithm family verifies with.
_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
REASONS = (
    "too_large",
    "malformed",
    "algorithm",
    "stream_token",
    "unknown_key",
    "signature",
    "expired",
    "not_yet_valid",
    "issued_at",
    "audience",
    "issuer",
    "missing_claim",
    "subject",
    "invalid",
)


def looks_like_jwt(token: str) -> bool:
    """Three dot-separated parts: what a bearer value must be to be checked as a JWT."""
    return token.count(".") == 2


def refuse(message: str, reason: str) -> InvalidToken:
    auth_failed(reason)
    return InvalidToken(message, reason=reason)


def _escape(part: str) -> str:
    """`%`, `:` and control characters percent-escaped: a principal's parts never run into each other."""
    return "".join(f"%{ord(c):02X}" if c in "%:" or ord(c) < 0x20 or ord(c) == 0x7F else c for c in part)


def principal_of(sub: str, tenant: str | None = None) -> str:
    """`jwt:<sub>`, or `jwt:<tenant>:<sub>`: always with a colon, which no key's principal holds."""
    parts = [sub] if tenant is None else [tenant, sub]
    return PRINCIPAL_PREFIX + ":".join(_escape(p) for p in parts)


class JwksKeys:
    """The keys of a JWKS URL: fetched at the first token, kept for `max_age` seconds, and fetched again
    (at most once every `min_refresh` seconds) when a token names a key id they do not hold, so that a key
    rotation at the identity provider needs no restart."""

    def __init__(self, url: str, *, timeout: float, min_refresh: float, max_age: float) -> None:
        self._url = url
        self._client = httpx.AsyncClient(timeout=timeout, follow_redirects=False)
        self._min_refresh = min_refresh
        self._max_age = max_age
        # (kid, the JWK's own `alg` if it names one, the key)
        self._keys: list[tuple[str | None, str | None, jwt.PyJWK]] = []
        self._fetched_at: float | None = None
        self._tried_at: float | None = None
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        await self._client.aclose()

    async def find(self, kid: str | None, algorithm: str) -> jwt.PyJWK | None:
        """The key `kid` names, of the type `algorithm` verifies with; without a kid, the only such key."""
        key = self._pick(kid, algorithm)
        now = time.monotonic()
        stale = self._fetched_at is None or now - self._fetched_at > self._max_age
        if key is not None and not stale:
            return key
        async with self._lock:
            key = self._pick(kid, algorithm)
            stale = self._fetched_at is None or time.monotonic() - self._fetched_at > self._max_age
            if key is not None and not stale:
                return key  # fetched by a request that held the lock first
            recently = self._tried_at is not None and time.monotonic() - self._tried_at < self._min_refresh
            if recently and self._fetched_at is not None:
                return key
            await self._fetch()
        return self._pick(kid, algorithm)

    def _pick(self, kid: str | None, algorithm: str) -> jwt.PyJWK | None:
        key_type = _KEY_TYPES.get(algorithm[:2])
        fitting = [
            key
            for key_id, named, key in self._keys
            if (kid is None or key_id == kid) and key.key_type == key_type and named in (None, algorithm)
        ]
        return fitting[0] if len(fitting) == 1 else None

    async def _fetch(self) -> None:
        self._tried_at = time.monotonic()
        try:
            response = await self._client.get(self._url, headers={"accept": "application/json"})
            response.raise_for_status()
            if len(response.content) > MAX_JWKS_BYTES:
                raise ValueError(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes")
            document = response.json()
            entries = document.get("keys") if isinstance(document, dict) else None
            if not isinstance(entries, list):
                raise ValueError('the JWKS has no "keys" list')
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("JWKS %s could not be fetched: %s", self._url, exc)
            if self._fetched_at is None:
                raise Unavailable(
                    "The identity provider's keys (PARLEY_JWT_JWKS_URL) cannot be fetched now.",
                    retry_after=max(1, round(self._min_refresh)),
                ) from exc
            return  # keep the keys fetched before
        keys: list[tuple[str | None, str | None, jwt.PyJWK]] = []
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(entry)
            except jwt.PyJWTError:
                continue  # a key type this server cannot use: tokens signed with it are refused
            kid, named = entry.get("kid"), entry.get("alg")
            keys.append(
                (kid if isinstance(kid, str) else None, named if isinstance(named, str) else None, key)
            )
        self._keys = keys
        self._fetched_at = time.monotonic()
        log.info("JWKS %s: %d signing key(s)", self._url, len(keys))


class JwtVerifier:
    """Checks a bearer JWT against the configuration and gives its principal."""

    def __init__(self, config: JwtConfig, jwks: JwksKeys | None) -> None:
        self._config = config
        self._jwks = jwks

    async def close(self) -> None:
        if self._jwks is not None:
            await self._jwks.close()

    async def principal(self, token: str) -> str:
        if len(token) > MAX_TOKEN_BYTES:
            raise refuse(f"The token is longer than {MAX_TOKEN_BYTES} bytes.", "too_large")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise refuse("The token is not a well-formed JWT.", "malformed") from exc
        if header.get("typ") == STREAM_TOKEN_TYPE:
            raise refuse(
                "A stream token opens its session's event stream only, as `?access_token=`.", "stream_token"
            )
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm not in self._config.algorithms:
            accepted = ", ".join(self._config.algorithms)
            raise refuse(f"The token's algorithm is not one this server accepts ({accepted}).", "algorithm")
        key = await self._key(header, algorithm)
        claims = self._decode(token, key, algorithm)
        return self._principal(claims)

    async def _key(self, header: dict[str, Any], algorithm: str) -> Any:
        if algorithm in HMAC_ALGORITHMS:
            return self._config.secret
        assert self._jwks is not None  # load_jwt_config: an asymmetric algorithm needs a JWKS URL
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise refuse("The token's `kid` header is not a string.", "malformed")
        found = await self._jwks.find(kid, algorithm)
        if found is None:
            raise refuse(
                "The token's key (its `kid`) is not among the identity provider's keys.", "unknown_key"
            )
        return found.key

    def _decode(self, token: str, key: Any, algorithm: str) -> dict[str, Any]:
        config = self._config
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=list(config.audience) or None,
                issuer=config.issuer,
                leeway=config.leeway,
                options={"require": ["exp", "sub"]},
            )
        except jwt.InvalidSignatureError as exc:
            raise refuse("The token's signature does not verify.", "signature") from exc
        except jwt.ExpiredSignatureError as exc:
            raise refuse("The token has expired (`exp`).", "expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise refuse("The token is not valid yet (`nbf`).", "not_yet_valid") from exc
        except jwt.InvalidIssuedAtError as exc:
            raise refuse("The token's `iat` is in the future or not a number.", "issued_at") from exc
        except jwt.InvalidAudienceError as exc:
            message = (
                "The token's audience (`aud`) is not one of PARLEY_JWT_AUDIENCE."
                if config.audience
                else "The token names an audience (`aud`), and this server is configured with none "
                "(PARLEY_JWT_AUDIENCE)."
            )
            raise refuse(message, "audience") from exc
        except jwt.InvalidIssuerError as exc:
            raise refuse("The token's issuer (`iss`) is not PARLEY_JWT_ISSUER.", "issuer") from exc
        except jwt.MissingRequiredClaimError as exc:
            raise refuse(f"The token has no `{exc.claim}` claim.", "missing_claim") from exc
        except jwt.exceptions.InvalidSubjectError as exc:
            raise refuse("The token's `sub` must be a non-empty string.", "subject") from exc
        except jwt.DecodeError as exc:
            raise refuse("The token is not a well-formed JWT.", "malformed") from exc
        except (jwt.InvalidKeyError, jwt.InvalidAlgorithmError) as exc:
            raise refuse("The token's key does not fit its algorithm.", "unknown_key") from exc
        except jwt.PyJWTError as exc:
            raise refuse("The token is not valid.", "invalid") from exc
        return claims

    def _principal(self, claims: dict[str, Any]) -> str:
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise refuse("The token's `sub` must be a non-empty string.", "subject")
        tenant = None
        name = self._config.tenant_claim
        if name is not None:
            value = claims.get(name)
            if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
                raise refuse(f"The token has no `{name}` claim (PARLEY_JWT_TENANT_CLAIM).", "missing_claim")
            tenant = str(value)
        principal = principal_of(sub, tenant)
        if len(principal) > MAX_PRINCIPAL:
            raise refuse(
                f"The token's `sub` (with its tenant) is too long: at most {MAX_PRINCIPAL - 5} characters.",
                "subject",
            )
        return principal
