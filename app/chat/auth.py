"""API keys and who may run without them.

Each bearer key belongs to a principal (a tenant); a principal owns the sessions it creates and sees no
other. Keys come from PARLEY_API_KEYS (`principal:key,principal:key`) and PARLEY_API_KEYS_FILE (JSON),
are held only as SHA-256 digests, and are compared in constant time against every configured key.

Bearer JWTs may be accepted beside the keys (PARLEY_JWT_*, docs/auth.md): `JwtConfig` is their checked
configuration, held by the key ring; app.chat.tokens verifies them. A token's principal always holds a
colon (`jwt:<sub>` or `jwt:<tenant>:<sub>`), which a key's principal never does: the two never collide.

With no keys and no JWT configuration at all the service is open: every caller is the anonymous
principal "". That is allowed only on a loopback address, or when PARLEY_ALLOW_OPEN says so: the launcher
(`python -m app`) refuses to start otherwise, and the middleware refuses requests that arrive on another
address (defense in depth for a server started some other way).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.settings import Settings

OPEN_PRINCIPAL = ""
MIN_KEY_LENGTH = 16
_PRINCIPAL = re.compile(r"^[A-Za-z0-9._@-]{1,100}$")
# A key is printable ASCII, what an Authorization header carries, without the space, the comma
# (PARLEY_API_KEYS separates its entries with it) or the four characters a URL's query string reads as
# something else: `&` ends a value, `#` the query, `+` is a space and `%` starts an escape. Any other
# character reaches the server unchanged in `?access_token=`, percent-encoded or not (curl sends a URL as
# typed), and the access log hides the value whole (observability/access_log.py).
_KEY_CHARACTERS = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ",&#+%")
_KEY = re.compile(f"[{re.escape(_KEY_CHARACTERS)}]+")
_KEY_RULE = (
    f"at least {MIN_KEY_LENGTH} printable ASCII characters without spaces, commas, &, #, + or % (a URL's "
    "query reads those four as something else); `openssl rand -hex 32` makes one"
)

OPEN_MODE_HELP = (
    "set PARLEY_API_KEYS=principal:key (or PARLEY_API_KEYS_FILE=/path/to/keys.json) to require keys, "
    "PARLEY_JWT_SECRET or PARLEY_JWT_JWKS_URL to require tokens, "
    "or PARLEY_ALLOW_OPEN=1 to serve without keys on purpose"
)


class ConfigError(ValueError):
    """The access configuration cannot be used; the message says what to change (and never shows a key)."""


# The algorithms each kind of key verifies; `none` is in neither, so it is never accepted.
HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
DEFAULT_JWKS_ALGORITHMS = ("RS256", "ES256", "EdDSA")
MIN_JWT_SECRET_BYTES = 32


@dataclass(frozen=True)
class JwtConfig:
    """How bearer JWTs are checked: the algorithms come from here, never from a token."""

    algorithms: tuple[str, ...]
    secret: bytes | None = None
    jwks_url: str | None = None
    audience: tuple[str, ...] = ()
    issuer: str | None = None
    tenant_claim: str | None = None
    leeway: float = 30.0


@dataclass(frozen=True)
class KeyRing:
    """The configured keys, as (principal, SHA-256 of the key) pairs, and the JWT configuration if any."""

    entries: tuple[tuple[str, bytes], ...] = ()
    jwt: JwtConfig | None = None

    @property
    def is_open(self) -> bool:
        return not self.entries and self.jwt is None

    @property
    def principals(self) -> frozenset[str]:
        return frozenset(principal for principal, _ in self.entries)

    def identify(self, key: str) -> str | None:
        """The principal of `key`, or None. Every configured key is compared, in constant time, on digests
        of equal length: how long this takes says neither which key matched nor how much of one did."""
        digest = _digest(key)
        found: str | None = None
        for principal, expected in self.entries:
            if hmac.compare_digest(digest, expected):
                found = principal
        return found


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def load_key_ring(settings: Settings) -> KeyRing:
    pairs = _parse_env(settings.api_keys)
    if settings.api_keys_file is not None:
        pairs += _parse_file(settings.api_keys_file)
    seen: dict[bytes, str] = {}
    entries: list[tuple[str, bytes]] = []
    for where, principal, key in pairs:
        if not _PRINCIPAL.match(principal):
            raise ConfigError(
                f"{where}: the principal must be 1 to 100 letters, digits or . _ @ - (got {principal!r})."
            )
        if len(key) < MIN_KEY_LENGTH or not _KEY.fullmatch(key):
            raise ConfigError(f"{where}: the key of {principal!r} must be {_KEY_RULE}.")
        digest = _digest(key)
        if seen.setdefault(digest, principal) != principal:
            raise ConfigError(f"{where}: {principal!r} and {seen[digest]!r} have the same key.")
        entries.append((principal, digest))
    return KeyRing(tuple(entries), load_jwt_config(settings))


def load_jwt_config(settings: Settings) -> JwtConfig | None:
    """The JWT configuration, checked; None when neither a secret nor a JWKS URL is set."""
    secret = settings.jwt_secret.encode() if settings.jwt_secret else None
    url = settings.jwt_jwks_url or None
    if secret is None and url is None:
        if settings.jwt_algorithms:
            raise ConfigError("PARLEY_JWT_ALGORITHMS needs PARLEY_JWT_SECRET or PARLEY_JWT_JWKS_URL.")
        return None
    if secret is not None and len(secret) < MIN_JWT_SECRET_BYTES:
        raise ConfigError(
            f"PARLEY_JWT_SECRET must be at least {MIN_JWT_SECRET_BYTES} bytes; "
            "`openssl rand -hex 32` makes one."
        )
    if url is not None and not url.startswith(("https://", "http://")):
        raise ConfigError("PARLEY_JWT_JWKS_URL must be an http:// or https:// URL.")
    algorithms = tuple(settings.jwt_algorithms)
    if not algorithms:
        algorithms = (("HS256",) if secret else ()) + (DEFAULT_JWKS_ALGORITHMS if url else ())
    for algorithm in algorithms:
        if algorithm in HMAC_ALGORITHMS:
            if secret is None:
                raise ConfigError(f"PARLEY_JWT_ALGORITHMS: {algorithm} needs PARLEY_JWT_SECRET.")
        elif algorithm in ASYMMETRIC_ALGORITHMS:
            if url is None:
                raise ConfigError(f"PARLEY_JWT_ALGORITHMS: {algorithm} needs PARLEY_JWT_JWKS_URL.")
        else:
            accepted = ", ".join(sorted(HMAC_ALGORITHMS | ASYMMETRIC_ALGORITHMS))
            raise ConfigError(f"PARLEY_JWT_ALGORITHMS: {algorithm!r} is not one of {accepted}.")
    if settings.jwt_tenant_claim is not None and not settings.jwt_tenant_claim.strip():
        raise ConfigError("PARLEY_JWT_TENANT_CLAIM must name a claim.")
    return JwtConfig(
        algorithms=tuple(dict.fromkeys(algorithms)),
        secret=secret,
        jwks_url=url,
        audience=tuple(settings.jwt_audience),
        issuer=settings.jwt_issuer or None,
        tenant_claim=settings.jwt_tenant_claim or None,
        leeway=settings.jwt_leeway_seconds,
    )


def _parse_env(value: str) -> list[tuple[str, str, str]]:
    pairs = []
    for n, item in enumerate((part.strip() for part in value.split(",")), start=1):
        if not item:
            continue
        principal, sep, key = item.partition(":")
        if not sep:
            # The entry itself is not shown: without a colon it may be a bare key.
            raise ConfigError(f"PARLEY_API_KEYS entry {n} is not of the form principal:key.")
        pairs.append((f"PARLEY_API_KEYS entry {n}", principal.strip(), key.strip()))
    return pairs


def _parse_file(path: Path) -> list[tuple[str, str, str]]:
    where = f"PARLEY_API_KEYS_FILE {path}"
    try:
        loaded: Any = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror}.") from exc
    except ValueError as exc:
        raise ConfigError(f"{where} is not valid JSON.") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f'{where} must hold an object: {{"principal": "key"}} or {{"principal": ["key"]}}.')
    pairs = []
    for principal, keys in loaded.items():
        listed = [keys] if isinstance(keys, str) else keys
        if not isinstance(listed, list) or not all(isinstance(k, str) for k in listed):
            raise ConfigError(f"{where}: the keys of {principal!r} must be a string or a list of strings.")
        for n, key in enumerate(listed, start=1):
            pairs.append((f"{where}, key {n} of {principal!r}" if len(listed) > 1 else where, principal, key))
    return pairs


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1, IPv4-mapped ::ffff:127.x)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # another host name: it may resolve to anything
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def open_mode_refusal(settings: Settings, keys: KeyRing, host: str) -> str | None:
    """Why the service must not serve on `host` as configured, or None when it may."""
    if not keys.is_open or settings.allow_open or is_loopback(host):
        return None
    return (
        f"Parley has no API keys and would serve everyone on {host}, beyond this machine: {OPEN_MODE_HELP}, "
        "or bind to 127.0.0.1."
    )
