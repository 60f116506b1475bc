"""API keys over a real socket: two tenants never see each other's sessions or streams, 401s, open mode."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keyed(settings: Settings) -> Iterator[LiveServer]:
    with live_server(settings.model_copy(update={"api_keys": f"alice:{ALICE},bob:{BOB}"})) as running:
        yield running


async def _alice_session_with_a_turn(alice: httpx.AsyncClient) -> dict[str, Any]:
    sid = (await alice.post("/v1/sessions", json={"title": "alice's"})).json()["id"]
    async with EventReader(alice, f"/v1/sessions/{sid}/events") as reader:
        posted = await alice.post(f"/v1/sessions/{sid}/messages", json={"content": "what time is it?"})
        assert posted.status_code == 202, posted.text
        await reader.wait_type("turn_done")
    return {"session_id": sid, "turn_id": posted.json()["turn_id"], "message_id": posted.json()["id"]}


def _session_routes(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """Every operation of the published spec that names a session: new routes are covered by themselves."""
    return [
        (method.upper(), path)
        for path, item in spec["paths"].items()
        if "{session_id}" in path
        for method in item
        if method in {"get", "post", "patch", "delete", "put"}
    ]


BODIES = {
    ("POST", "/v1/sessions/{session_id}/messages"): {"content": "let me in"},
    ("PATCH", "/v1/sessions/{session_id}"): {"title": "taken over"},
    ("POST", "/v1/sessions/{session_id}/cancel"): {"clear_queue": True},
    ("POST", "/v1/sessions/{session_id}/tool_results"): {"results": [{"tool_call_id": "c", "output": "x"}]},
    ("POST", "/v1/sessions/{session_id}/approvals"): {
        "decisions": [{"tool_call_id": "c", "decision": "approve"}]
    },
    ("POST", "/v1/sessions/{session_id}/turns/{turn_id}/edit"): {"content": "taken over"},
    ("POST", "/v1/sessions/{session_id}/fork"): {"turn_id": "t_000000000000"},
}


async def test_another_principal_gets_404_on_every_session_route_and_changes_nothing(
    keyed: LiveServer,
) -> None:
    async with (
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30, headers=bearer(ALICE)) as alice,
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30, headers=bearer(BOB)) as bob,
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as browser,
    ):
        ids = await _alice_session_with_a_turn(alice)
        sid = ids["session_id"]
        before = {
            "session": (await alice.get(f"/v1/sessions/{sid}")).json(),
            "history": (await alice.get(f"/v1/sessions/{sid}/messages")).json(),
        }
        spec = (await alice.get("/openapi.json")).json()
        routes = _session_routes(spec)
        assert len(routes) >= 10, routes
        # DELETE last: if it did reach alice's session, nothing after it would prove anything.
        for method, template in sorted(routes, key=lambda route: route[0] == "DELETE"):
            path = template.format(**ids)
            if template.endswith("/events"):
                for client, params in ((bob, {}), (browser, {"access_token": BOB})):
                    async with client.stream("GET", path, params=params) as stream:
                        await stream.aread()
                    assert stream.status_code == 404, (path, params)
                continue
            response = await bob.request(method, path, json=BODIES.get((method, template)))
            assert response.status_code == 404, (method, template, response.text)
            error = response.json()["error"]
            assert error["code"] == "not_found"
            assert error["request_id"] == response.headers["x-request-id"]

        assert (await bob.get("/v1/sessions")).json()["sessions"] == []
        assert [s["id"] for s in (await alice.get("/v1/sessions")).json()["sessions"]] == [sid]
        assert (await alice.get(f"/v1/sessions/{sid}")).json() == before["session"]
        assert (await alice.get(f"/v1/sessions/{sid}/messages")).json() == before["history"]


async def test_each_tenant_streams_only_its_own_session(keyed: LiveServer) -> None:
    async with (
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30, headers=bearer(ALICE)) as alice,
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30, headers=bearer(BOB)) as bob,
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as browser,
    ):
        a = (await alice.post("/v1/sessions", json={})).json()["id"]
        b = (await bob.post("/v1/sessions", json={})).json()["id"]
        # EventSource sends no headers: the key rides in the URL.
        async with (
            EventReader(browser, f"/v1/sessions/{a}/events?access_token={ALICE}") as alice_stream,
            EventReader(bob, f"/v1/sessions/{b}/events") as bob_stream,
        ):
            await alice.post(f"/v1/sessions/{a}/messages", json={"content": "alice here"})
            await bob.post(f"/v1/sessions/{b}/messages", json={"content": "bob here"})
            await alice_stream.wait_type("turn_done")
            await bob_stream.wait_type("turn_done")
        assert {e.data["session_id"] for e in alice_stream.events} == {a}
        assert {e.data["session_id"] for e in bob_stream.events} == {b}
        assert [m["text"] for m in alice_stream.of_type("user_message")] == ["alice here"]
        assert [m["text"] for m in bob_stream.of_type("user_message")] == ["bob here"]


async def test_idempotency_keys_are_scoped_to_the_principal(keyed: LiveServer) -> None:
    async with (
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30, headers=bearer(ALICE)) as alice,
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30, headers=bearer(BOB)) as bob,
    ):
        same = {"Idempotency-Key": "create-1"}
        first = await alice.post("/v1/sessions", json={"title": "t"}, headers=same)
        other = await bob.post("/v1/sessions", json={"title": "t"}, headers=same)
        again = await alice.post("/v1/sessions", json={"title": "t"}, headers=same)
        assert (first.status_code, other.status_code, again.status_code) == (201, 201, 201)
        assert other.json()["id"] != first.json()["id"]
        assert "idempotent-replayed" not in other.headers
        assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
        assert [s["id"] for s in (await bob.get("/v1/sessions")).json()["sessions"]] == [other.json()["id"]]


@pytest.mark.parametrize(
    ("headers", "params", "message"),
    [
        ({}, {}, "An API key is required"),
        ({"Authorization": "Bearer not-a-key-0000000000"}, {}, "not valid"),
        ({"Authorization": f"Basic {ALICE}"}, {}, "An API key is required"),
        ({"Authorization": "Bearer"}, {}, "An API key is required"),
        # Only the stream takes the key from the URL.
        ({}, {"access_token": ALICE}, "An API key is required"),
    ],
)
async def test_missing_or_unknown_keys_get_401(
    keyed: LiveServer, headers: dict[str, str], params: dict[str, str], message: str
) -> None:
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as client:
        for method, path in [("GET", "/v1/sessions"), ("POST", "/v1/sessions"), ("GET", "/v1/models")]:
            response = await client.request(method, path, headers=headers, params=params, json={})
            assert response.status_code == 401, (method, path)
            assert response.headers["www-authenticate"] == "Bearer"
            error = response.json()["error"]
            assert error["code"] == "unauthorized"
            assert message in error["message"]
            assert error["request_id"] == response.headers["x-request-id"]
            assert ALICE not in response.text
        assert (await client.get("/v1/sessions", headers=bearer(ALICE))).json()["sessions"] == []


async def test_the_stream_refuses_a_wrong_access_token_and_the_header_wins(keyed: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={}, headers=bearer(ALICE))).json()["id"]
        url = f"/v1/sessions/{sid}/events"
        for headers, params, status in [
            ({}, {}, 401),
            ({}, {"access_token": "wrong-key-0000000000000"}, 401),
            ({}, {"access_token": BOB}, 404),  # bob's key: bob is told the session does not exist
            (bearer(ALICE), {"access_token": BOB}, 200),
            (bearer(BOB), {"access_token": ALICE}, 404),
        ]:
            async with client.stream("GET", url, headers=headers, params=params) as response:
                assert response.status_code == status, (headers, params)
                if status == 401:
                    await response.aread()
                    assert response.headers["www-authenticate"] == "Bearer"


async def test_health_probes_and_the_docs_stay_open(keyed: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as client:
        for path in ("/healthz", "/openapi.json", "/docs"):
            assert (await client.get(path)).status_code == 200, path
        # /readyz answers 503 while the model layer loads (the server serves before it has loaded): without
        # a key it is never a 401, and it turns 200 once loaded.
        deadline = asyncio.get_running_loop().time() + 30
        while (answer := (await client.get("/readyz")).status_code) != 200:
            assert answer == 503, answer
            assert asyncio.get_running_loop().time() < deadline, "/readyz never turned 200"
            await asyncio.sleep(0.05)


async def test_every_v1_operation_declares_the_key_and_documents_401(keyed: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as client:
        spec = (await client.get("/openapi.json")).json()
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if path.startswith("/v1/"):
                assert {"ApiKey": []} in operation["security"], (method, path)
                assert "401" in operation["responses"], (method, path)
            else:
                assert "security" not in operation, (method, path)
    events = spec["paths"]["/v1/sessions/{session_id}/events"]["get"]
    assert events["security"] == [{"ApiKey": []}, {"AccessToken": []}, {"BearerJWT": []}]


async def test_without_keys_everyone_is_the_same_anonymous_caller(server: LiveServer) -> None:
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=30) as anonymous,
        httpx.AsyncClient(
            base_url=server.base_url, timeout=30, headers=bearer("anything-at-all-000")
        ) as other,
    ):
        created = await anonymous.post("/v1/sessions", json={})
        assert created.status_code == 201
        sid = created.json()["id"]
        # A key sent to a server without keys is ignored: it names no one.
        assert (await other.get(f"/v1/sessions/{sid}")).status_code == 200
        assert [s["id"] for s in (await other.get("/v1/sessions")).json()["sessions"]] == [sid]


async def test_racing_tenants_with_one_idempotency_key_each_get_their_own_message(keyed: LiveServer) -> None:
    async with (
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30, headers=bearer(ALICE)) as alice,
        httpx.AsyncClient(base_url=keyed.base_url, timeout=30, headers=bearer(BOB)) as bob,
    ):
        a = (await alice.post("/v1/sessions", json={})).json()["id"]
        b = (await bob.post("/v1/sessions", json={})).json()["id"]
        key = {"Idempotency-Key": "same-key"}
        answers = await asyncio.gather(
            alice.post(f"/v1/sessions/{a}/messages", json={"content": "hi"}, headers=key),
            bob.post(f"/v1/sessions/{b}/messages", json={"content": "hi"}, headers=key),
        )
        assert [r.status_code for r in answers] == [202, 202]
        assert answers[0].json()["id"] != answers[1].json()["id"]
        assert re.fullmatch(r"m_[0-9a-f]{12}", answers[1].json()["id"])


async def test_the_streams_401_names_access_token_and_other_routes_do_not(keyed: LiveServer) -> None:
    """A page whose EventSource got a 401 fetches the same URL to learn why: the answer says how a browser
    passes the key. Other routes take no query key, so their 401 does not suggest one."""
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={}, headers=bearer(ALICE))).json()["id"]
        for params in ({}, {"access_token": "wrong-key-0000000000000"}):
            response = await client.get(f"/v1/sessions/{sid}/events", params=params)
            assert response.status_code == 401
            assert "?access_token=<key>" in response.json()["error"]["message"]
        plain = await client.get("/v1/sessions", headers=bearer("wrong-key-0000000000000"))
        assert plain.status_code == 401 and "access_token" not in plain.json()["error"]["message"]
