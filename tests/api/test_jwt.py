"""Bearer JWTs over a real socket: HS256 tokens of a product backend, tokens of an identity provider's
JWKS (served over HTTP, its keys rotated mid-run), every refusal naming its check, and users of one tenant
and of another isolated on every session route."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from app.chat.tokens import principal_of
from app.settings import Settings
from tests.api.test_auth import BODIES, _alice_session_with_a_turn, _session_routes
from tests.support.jwks import (
    AUDIENCE,
    ISSUER,
    claims,
    ec_key,
    ed_key,
    hmac_signed,
    jwks_server,
    rsa_key,
    unsigned,
)
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

SECRET = "product-backend-secret-0123456789abcdef0123456789"
KEY = "service-key-0123456789abcdef"


def hs256(payload: dict[str, Any], secret: str = SECRET, **headers: Any) -> str:
    return jwt.encode(payload, secret, algorithm="HS256", headers=headers or None)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def hs_server(settings: Settings) -> Iterator[LiveServer]:
    configured = settings.model_copy(
        update={
            "api_keys": f"backend:{KEY}",
            "jwt_secret": SECRET,
            "jwt_audience": [AUDIENCE],
            "jwt_issuer": ISSUER,
            "jwt_tenant_claim": "org_id",
            "metrics": True,
        }
    )
    with live_server(configured) as running:
        yield running


def test_principals_of_tokens_never_collide_with_keys_or_each_other() -> None:
    assert principal_of("alice") == "jwt:alice"
    assert principal_of("auth0|42", "acme") == "jwt:acme:auth0|42"
    # A colon in a tenant or sub is escaped: ("a:b", "c") and ("a", "b:c") stay two principals.
    assert principal_of("c", "a:b") != principal_of("b:c", "a")
    assert principal_of("x%3Ay") != principal_of("x:y")


async def test_users_of_one_tenant_and_of_another_see_only_their_own_sessions(hs_server: LiveServer) -> None:
    users = {
        "alice": hs256(claims("alice", org="acme")),
        "bob": hs256(claims("bob", org="acme")),
        "carol": hs256(claims("alice", org="globex")),  # the same sub in another tenant
        "backend": KEY,
    }
    clients = {
        name: httpx.AsyncClient(base_url=hs_server.base_url, timeout=30, headers=bearer(token))
        for name, token in users.items()
    }
    try:
        created = {}
        for name, client in clients.items():
            response = await client.post("/v1/sessions", json={"title": f"{name}'s"})
            assert response.status_code == 201, response.text
            created[name] = response.json()["id"]
        alice = clients["alice"]
        async with EventReader(alice, f"/v1/sessions/{created['alice']}/events") as reader:
            posted = await alice.post(f"/v1/sessions/{created['alice']}/messages", json={"content": "hi"})
            assert posted.status_code == 202, posted.text
            await reader.wait_type("turn_done")
        for name, client in clients.items():
            listed = (await client.get("/v1/sessions")).json()["sessions"]
            assert [s["id"] for s in listed] == [created[name]], name
            for other, sid in created.items():
                if other == name:
                    continue
                for method, path, body in [
                    ("GET", f"/v1/sessions/{sid}", None),
                    ("PATCH", f"/v1/sessions/{sid}", {"title": "mine now"}),
                    ("GET", f"/v1/sessions/{sid}/messages", None),
                    ("POST", f"/v1/sessions/{sid}/messages", {"content": "let me in"}),
                    ("POST", f"/v1/sessions/{sid}/stream_token", None),
                    ("GET", f"/v1/sessions/{sid}/events?until_idle=true", None),
                    ("DELETE", f"/v1/sessions/{sid}", None),
                ]:
                    response = await client.request(method, path, json=body)
                    assert response.status_code == 404, (name, other, method, path, response.text)
        history = (await alice.get(f"/v1/sessions/{created['alice']}/messages")).json()["chat_messages"]
        assert [m.get("content") for m in history if m["type"] == "text" and m.get("role") == "user"] == [
            "hi"
        ]
        assert (await alice.get(f"/v1/sessions/{created['alice']}")).json()["title"] == "alice's"
    finally:
        for client in clients.values():
            await client.aclose()


def _refusals() -> list[tuple[str, str, str]]:
    """(case, token, the reason the 401 names)."""
    now = int(time.time())
    good = claims("alice", org="acme")
    public_pem = (
        rsa_key("k")
        .private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    valid = hs256(good)
    return [
        ("expired", hs256({**good, "exp": now - 120}), "expired"),
        ("not yet valid", hs256({**good, "nbf": now + 600}), "not_yet_valid"),
        ("wrong audience", hs256({**good, "aud": "someone-else"}), "audience"),
        ("no audience", hs256({k: v for k, v in good.items() if k != "aud"}), "missing_claim"),
        ("wrong issuer", hs256({**good, "iss": "https://evil.test/"}), "issuer"),
        ("no sub", hs256({k: v for k, v in good.items() if k != "sub"}), "missing_claim"),
        ("no exp", hs256({k: v for k, v in good.items() if k != "exp"}), "missing_claim"),
        ("no tenant", hs256({k: v for k, v in good.items() if k != "org_id"}), "missing_claim"),
        ("a sub too long to be a principal", hs256({**good, "sub": "u" * 120}), "subject"),
        ("a sub that is not a string", hs256({**good, "sub": 42}), "subject"),
        ("another secret", hs256(good, secret="another-secret-0123456789abcdef0123456"), "signature"),
        ("alg none", unsigned({"alg": "none", "typ": "JWT"}, good), "algorithm"),
        ("HS256 signed with a public key", hmac_signed({"alg": "HS512"}, good, public_pem), "algorithm"),
        # 43 base64 characters of a 32-byte HMAC: 3 fewer always decode (to 30 bytes).
        ("truncated signature", valid[:-3], "signature"),
        ("huge header", hs256(good, x="a" * 9000), "too_large"),
        ("not base64", "eyJ!.eyJ.sig", "malformed"),
    ]


async def test_refused_tokens_get_401_invalid_token_naming_the_check(hs_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=hs_server.base_url, timeout=30) as client:
        for case, token, reason in _refusals():
            response = await client.get("/v1/sessions", headers=bearer(token))
            assert response.status_code == 401, (case, response.text)
            assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"', case
            error = response.json()["error"]
            assert (error["code"], error["details"]["reason"]) == ("invalid_token", reason), (case, error)
            for part in token.split("."):
                if len(part) >= 8:
                    assert part not in response.text, case
        scrape = (await client.get("/metrics")).text
    for reason in ("expired", "audience", "issuer", "signature", "algorithm", "too_large"):
        assert f'parley_auth_failures_total{{reason="{reason}"}}' in scrape, reason
    assert "eyJ" not in scrape


async def test_keys_and_tokens_work_side_by_side_and_a_bad_key_is_still_unauthorized(
    hs_server: LiveServer,
) -> None:
    async with httpx.AsyncClient(base_url=hs_server.base_url, timeout=30) as client:
        assert (await client.get("/v1/sessions", headers=bearer(KEY))).status_code == 200
        assert (
            await client.get("/v1/sessions", headers=bearer(hs256(claims("a", org="o"))))
        ).status_code == 200
        wrong = await client.get("/v1/sessions", headers=bearer("not-a-key-0000000000000"))
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
        missing = await client.get("/v1/sessions")
        assert missing.status_code == 401 and "token" in missing.json()["error"]["message"]


async def test_jwks_tokens_of_three_key_types_and_a_key_rotation_without_restart(settings: Settings) -> None:
    # Made first: an RSA key takes a while to generate, and the test's timing is the refresh interval's.
    first, ec, ed, second = rsa_key("rsa-1"), ec_key("ec-1"), ed_key("ed-1"), rsa_key("rsa-2")
    strangers = [rsa_key(f"x-{n}") for n in range(5)]
    with jwks_server(first, ec, ed) as idp:
        configured = settings.model_copy(
            update={
                "jwt_jwks_url": idp.url,
                "jwt_audience": [AUDIENCE],
                "jwt_issuer": ISSUER,
                "jwt_jwks_refresh_seconds": 3.0,
            }
        )
        with live_server(configured) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:

                async def status(token: str) -> tuple[int, str | None]:
                    response = await client.get("/v1/sessions", headers=bearer(token))
                    reason = (
                        response.json()["error"]["details"]["reason"] if response.status_code == 401 else None
                    )
                    return response.status_code, reason

                await _ready(client)  # the model layer's load holds the GIL: the timing below would stretch
                for key in (first, ec, ed):
                    assert await status(key.sign(claims("dana"))) == (200, None), key.algorithm
                assert idp.fetches == 1  # cached

                created = await client.post(
                    "/v1/sessions", json={}, headers=bearer(first.sign(claims("dana")))
                )
                sid = created.json()["id"]

                # The provider rotates: the old key is gone, a new one signs.
                rotated = second.sign(claims("dana"))
                idp.publish(second, ec, ed)
                # Within the refresh interval of the last fetch, an unknown kid does not fetch again.
                assert await status(rotated) == (401, "unknown_key")
                assert idp.fetches == 1
                await asyncio.sleep(3.1)  # the interval under test, not a synchronisation
                assert await status(rotated) == (200, None)
                assert idp.fetches == 2
                # The same user, with the new key: the same sessions.
                listed = await client.get("/v1/sessions", headers=bearer(rotated))
                assert [s["id"] for s in listed.json()["sessions"]] == [sid]
                # The old key's tokens are refused once the set no longer holds it...
                assert await status(first.sign(claims("dana"))) == (401, "unknown_key")
                # ... and a burst of unknown kids costs no fetch.
                for stranger in strangers:
                    assert await status(stranger.sign(claims("dana"))) == (401, "unknown_key")
                assert idp.fetches == 2

                # HS/RS confusion: HS256 signed with the provider's public key is not even tried.
                public_pem = second.private.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
                confused = hmac_signed({"alg": "HS256", "kid": "rsa-2"}, claims("dana"), public_pem)
                assert await status(confused) == (401, "algorithm")
                # A key of one type named for an algorithm of another.
                assert await status(
                    jwt.encode(claims("dana"), ec.private, algorithm="ES256", headers={"kid": "rsa-2"})
                ) == (401, "unknown_key")
                assert await status(unsigned({"alg": "none", "kid": "rsa-2"}, claims("dana"))) == (
                    401,
                    "algorithm",
                )


async def _ready(client: httpx.AsyncClient) -> None:
    deadline = asyncio.get_running_loop().time() + 120
    while (answer := (await client.get("/readyz")).status_code) != 200:
        assert answer == 503, answer
        assert asyncio.get_running_loop().time() < deadline, "/readyz never turned 200"
        await asyncio.sleep(0.05)


async def test_a_jwks_that_cannot_be_fetched_is_503_not_401(settings: Settings) -> None:
    with jwks_server() as idp:
        url = idp.url
    configured = settings.model_copy(update={"jwt_jwks_url": url, "jwt_jwks_timeout": 2.0})
    with live_server(configured) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            response = await client.get("/v1/sessions", headers=bearer(rsa_key("k").sign(claims("x"))))
    assert response.status_code == 503, response.text
    assert "PARLEY_JWT_JWKS_URL" in response.json()["error"]["message"]


async def test_another_user_of_the_same_tenant_gets_404_on_every_session_route(hs_server: LiveServer) -> None:
    """Every operation of the spec that names a session (new routes are covered by themselves), as in
    test_auth.py for keys: bob of acme, with a valid token, finds nothing of alice of acme."""
    alice_token, bob_token = hs256(claims("alice", org="acme")), hs256(claims("bob", org="acme"))
    async with (
        httpx.AsyncClient(base_url=hs_server.base_url, timeout=30, headers=bearer(alice_token)) as alice,
        httpx.AsyncClient(base_url=hs_server.base_url, timeout=30, headers=bearer(bob_token)) as bob,
        httpx.AsyncClient(base_url=hs_server.base_url, timeout=30) as browser,
    ):
        ids = await _alice_session_with_a_turn(alice)
        sid = ids["session_id"]
        before = (await alice.get(f"/v1/sessions/{sid}/messages")).json()
        routes = _session_routes((await alice.get("/openapi.json")).json())
        assert ("POST", "/v1/sessions/{session_id}/stream_token") in routes
        for method, template in sorted(routes, key=lambda route: route[0] == "DELETE"):
            path = template.format(**ids)
            if template.endswith("/events"):
                for client, params in ((bob, {}), (browser, {"access_token": bob_token})):
                    async with client.stream("GET", path, params=params) as stream:
                        await stream.aread()
                    assert stream.status_code == 404, (path, params)
                continue
            response = await bob.request(method, path, json=BODIES.get((method, template)))
            assert response.status_code == 404, (method, template, response.text)
        assert (await alice.get(f"/v1/sessions/{sid}/messages")).json() == before


async def test_another_user_of_the_same_tenant_finds_none_of_a_users_files(hs_server: LiveServer) -> None:
    """Files are per principal for tokens as for keys: bob of acme gets 404 on alice's file everywhere,
    cannot attach it, and does not see it listed; the same bytes he uploads are a file of his own."""
    alice_token, bob_token = hs256(claims("alice", org="acme")), hs256(claims("bob", org="acme"))
    async with (
        httpx.AsyncClient(base_url=hs_server.base_url, timeout=30, headers=bearer(alice_token)) as alice,
        httpx.AsyncClient(base_url=hs_server.base_url, timeout=30, headers=bearer(bob_token)) as bob,
    ):
        note = ("note.txt", b"alice's notes\n", "text/plain")
        uploaded = await alice.post("/v1/files", files={"file": note})
        assert uploaded.status_code == 201, uploaded.text
        file_id = uploaded.json()["id"]
        for method, path in (
            ("GET", f"/v1/files/{file_id}"),
            ("GET", f"/v1/files/{file_id}/content"),
            ("DELETE", f"/v1/files/{file_id}"),
        ):
            assert (await bob.request(method, path)).status_code == 404, (method, path)
        assert (await bob.get("/v1/files")).json()["files"] == []
        sid = (await bob.post("/v1/sessions", json={})).json()["id"]
        attached = await bob.post(
            f"/v1/sessions/{sid}/messages",
            json={"content": "read this", "attachments": [{"file_id": file_id}]},
        )
        assert attached.status_code == 404, attached.text
        assert (await bob.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"] == []
        own = await bob.post("/v1/files", files={"file": note})
        assert own.status_code == 201 and own.json()["id"] != file_id
        assert (await alice.get(f"/v1/files/{file_id}")).status_code == 200
