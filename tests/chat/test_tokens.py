"""The JWT configuration is checked before the server serves: what cannot work stops it with a message
naming the setting; and what turns the service from open to closed."""

from __future__ import annotations

from typing import Any

import pytest

from app.chat.auth import ConfigError, load_key_ring, open_mode_refusal
from app.chat.tokens import looks_like_jwt
from app.settings import Settings

SECRET = "0123456789abcdef0123456789abcdef"
JWKS = "https://idp.example/.well-known/jwks.json"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"jwt_secret": "short"}, "at least 32 bytes"),
        ({"jwt_jwks_url": "ftp://idp.example/jwks"}, "http:// or https://"),
        ({"jwt_secret": SECRET, "jwt_algorithms": ["RS256"]}, "RS256 needs PARLEY_JWT_JWKS_URL"),
        ({"jwt_jwks_url": JWKS, "jwt_algorithms": ["HS256"]}, "HS256 needs PARLEY_JWT_SECRET"),
        ({"jwt_secret": SECRET, "jwt_algorithms": ["none"]}, "'none' is not one of"),
        ({"jwt_algorithms": ["HS256"]}, "needs PARLEY_JWT_SECRET or PARLEY_JWT_JWKS_URL"),
        ({"jwt_secret": SECRET, "jwt_tenant_claim": " "}, "must name a claim"),
    ],
)
def test_a_configuration_that_cannot_work_is_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        load_key_ring(Settings(**settings))
    assert SECRET not in str(refused.value)


def test_defaults_follow_what_is_configured() -> None:
    assert load_key_ring(Settings()).jwt is None
    hs = load_key_ring(Settings(jwt_secret=SECRET)).jwt
    assert hs is not None and hs.algorithms == ("HS256",) and hs.secret == SECRET.encode()
    both = load_key_ring(Settings(jwt_secret=SECRET, jwt_jwks_url=JWKS, jwt_audience="a,b")).jwt
    assert both is not None and both.algorithms == ("HS256", "RS256", "ES256", "EdDSA")
    assert both.audience == ("a", "b")


def test_tokens_alone_close_the_open_mode() -> None:
    ring = load_key_ring(Settings(jwt_jwks_url=JWKS))
    assert not ring.is_open
    assert open_mode_refusal(Settings(jwt_jwks_url=JWKS), ring, "0.0.0.0") is None
    assert open_mode_refusal(Settings(), load_key_ring(Settings()), "0.0.0.0") is not None


def test_what_is_checked_as_a_jwt() -> None:
    assert looks_like_jwt("a.b.c")
    assert not looks_like_jwt("a-plain-key-0123456789")
