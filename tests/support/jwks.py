"""An identity provider's signing keys for tests: key pairs made with `cryptography`, tokens signed with
PyJWT, and a JWKS document served over HTTP by a real uvicorn server on a free port, whose keys a test
can change while Parley runs (a key rotation)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.server import free_port

ISSUER = "https://idp.parley.test/"
AUDIENCE = "parley-api"


@dataclass
class SigningKey:
    kid: str
    algorithm: str
    private: Any

    @property
    def public_jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        if self.algorithm.startswith("RS"):
            jwk = RSAAlgorithm.to_jwk(public, as_dict=True)
        elif self.algorithm.startswith("ES"):
            jwk = ECAlgorithm.to_jwk(public, as_dict=True)
        else:
            jwk = OKPAlgorithm.to_jwk(public, as_dict=True)
        return {**jwk, "kid": self.kid, "use": "sig", "alg": self.algorithm}

    def sign(self, claims: dict[str, Any], **headers: Any) -> str:
        return jwt.encode(
            claims, self.private, algorithm=self.algorithm, headers={"kid": self.kid, **headers}
        )


def rsa_key(kid: str) -> SigningKey:
    return SigningKey(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


def ec_key(kid: str) -> SigningKey:
    return SigningKey(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


def ed_key(kid: str) -> SigningKey:
    return SigningKey(kid, "EdDSA", ed25519.Ed25519PrivateKey.generate())


def claims(sub: str, *, org: str | None = None, lifetime: float = 300, **extra: Any) -> dict[str, Any]:
    now = int(time.time())
    found: dict[str, Any] = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + lifetime}
    if org is not None:
        found["org_id"] = org
    return {**found, **extra}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], payload: dict[str, Any]) -> str:
    """`header.payload.` with an empty signature, as an `alg: none` token is."""
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}."


def hmac_signed(header: dict[str, Any], payload: dict[str, Any], secret: bytes) -> str:
    """Signed by hand: PyJWT refuses to use a public key as an HMAC secret, which is the attack."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


@dataclass
class JwksServer:
    url: str
    keys: list[SigningKey] = field(default_factory=list)
    fetches: int = 0

    def publish(self, *keys: SigningKey) -> None:
        self.keys = list(keys)


@contextmanager
def jwks_server(*keys: SigningKey) -> Iterator[JwksServer]:
    port = free_port()
    served = JwksServer(f"http://127.0.0.1:{port}/.well-known/jwks.json", list(keys))

    async def jwks(_request: Request) -> JSONResponse:
        served.fetches += 1
        return JSONResponse({"keys": [k.public_jwk for k in served.keys]})

    app = Starlette(routes=[Route("/.well-known/jwks.json", jwks)])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"jwks:{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise TimeoutError("the JWKS server did not start")
        time.sleep(0.01)
    try:
        yield served
    finally:
        server.should_exit = True
        thread.join(timeout=10)
