"""AWS Signature Version 4 for S3 requests (the Authorization header), as AWS's S3 documentation gives it:
a canonical request, a string to sign over its hash, an HMAC chain from the secret key over the date, region
and service. Pure functions: the object store (app.storage.object_store) signs each request it sends."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    session_token: str | None = None


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def canonical_path(path: str) -> str:
    """S3's canonical URI: each segment percent-encoded once (unreserved characters and `/` kept)."""
    return quote(path or "/", safe="/-_.~")


def canonical_query(query: dict[str, str]) -> str:
    return "&".join(
        f"{quote(key, safe='-_.~')}={quote(value, safe='-_.~')}" for key, value in sorted(query.items())
    )


def sign(
    method: str,
    host: str,
    path: str,
    query: dict[str, str],
    headers: dict[str, str],
    payload_sha256: str,
    credentials: Credentials,
    region: str,
    now: datetime,
    service: str = "s3",
) -> dict[str, str]:
    """`headers` with those the signature needs (`x-amz-date`, `x-amz-content-sha256`, a session token's
    `x-amz-security-token`) and `Authorization`; every header given is signed, with `host`. `path` is
    the request's path as it goes on the wire's canonical form (not yet encoded); `now` in UTC."""
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    signed = {key.lower(): " ".join(value.strip().split()) for key, value in headers.items()}
    signed["host"] = host
    signed["x-amz-date"] = stamp
    signed["x-amz-content-sha256"] = payload_sha256
    if credentials.session_token:
        signed["x-amz-security-token"] = credentials.session_token
    names = sorted(signed)
    canonical = "\n".join(
        [
            method.upper(),
            canonical_path(path),
            canonical_query(query),
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(("AWS4" + credentials.secret_key).encode(), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {name: value for name, value in signed.items() if name != "host"}
    out["authorization"] = (
        f"{ALGORITHM} Credential={credentials.access_key}/{scope}, SignedHeaders={';'.join(names)}, "
        f"Signature={signature}"
    )
    return out
