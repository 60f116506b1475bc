"""Branches over a real socket against the strict fake upstream (docs/protocol.md, Branches): regenerate,
edit (with attachments, checked as a posted message's), activate and fork; the model is sent exactly the
active path (the upstream's log), the history and
the turn view follow it, siblings and indexes, branch_changed on every open stream, a fork that goes on
alone, 404 for another principal's ids, 409 while a turn runs, Idempotency-Key, and the metric."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from app.settings import Settings
from tests.fakes.upstream import FakeUpstream, Script, validate_history
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = "openai/fake-model"
OTHER = "openai/other-model"
ALICE = "sk-alice-0123456789abcdef"
BOB = "sk-bob-0123456789abcdef00"


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key="sk-test", strict=True) as running:
        yield running


@pytest.fixture
def server(
    settings: Settings, upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LiveServer]:
    monkeypatch.setenv("PARLEY_TEST_FAKE_KEY", "sk-test")
    models = tmp_path / "models.json"
    provider = {
        "api_base": upstream.base_url,
        "api_key_env": "PARLEY_TEST_FAKE_KEY",
        "models": {MODEL: {"vision": True}, OTHER: {"vision": False}},
    }
    models.write_text(json.dumps({"providers": {"fake": provider}}))
    configured = settings.model_copy(
        update={
            "models_file": models,
            "default_model": MODEL,
            "api_keys": f"alice:{ALICE},bob:{BOB}",
            "metrics": True,
        }
    )
    with live_server(configured) as running:
        yield running


@pytest.fixture
async def alice(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ALICE}"}
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture
async def bob(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {BOB}"}
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=30) as client:
        yield client


async def _session(client: httpx.AsyncClient) -> str:
    created = await client.post("/v1/sessions", json={})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


async def _ask(client: httpx.AsyncClient, sid: str, content: str) -> str:
    """Posts a message and waits for its turn's end: the turn id."""
    answer = await client.post(f"/v1/sessions/{sid}/messages?wait=true", json={"content": content})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed", answer.json()
    return str(answer.json()["turn_id"])


async def _ended(client: httpx.AsyncClient, sid: str, turn_id: str) -> dict[str, Any]:
    turn = await client.get(f"/v1/sessions/{sid}/turns/{turn_id}?wait=true")
    assert turn.status_code == 200, turn.text
    assert turn.json()["status"] == "completed", turn.json()
    found: dict[str, Any] = turn.json()
    return found


async def _history(client: httpx.AsyncClient, sid: str) -> list[tuple[str | None, str | None]]:
    """The active path's user and assistant texts, as (role, content)."""
    page = await client.get(f"/v1/sessions/{sid}/messages")
    assert page.status_code == 200, page.text
    return [(m["role"], m["content"]) for m in page.json()["chat_messages"] if m["type"] == "text"]


async def _turns(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    page = await client.get(f"/v1/sessions/{sid}/turns")
    assert page.status_code == 200, page.text
    turns: list[dict[str, Any]] = page.json()["turns"]
    return turns


def _sent(upstream: FakeUpstream) -> list[tuple[str, str]]:
    """What the last model request held: (role, content) of each message, checked by the strict rules."""
    messages = upstream.requests[-1].body["messages"]
    assert validate_history(messages) == []
    return [(m["role"], m["content"]) for m in messages]


async def test_regenerate_activate_and_edit_send_the_model_exactly_the_active_path(
    alice: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = await _session(alice)
    upstream.enqueue(Script.text("a1"), Script.text("a2"))
    t1 = await _ask(alice, sid, "q1")
    t2 = await _ask(alice, sid, "q2")

    upstream.enqueue(Script.text("a2 again"))
    regenerated = await alice.post(f"/v1/sessions/{sid}/turns/{t2}/regenerate")
    assert regenerated.status_code == 202, regenerated.text
    t2b = regenerated.json()["turn_id"]
    assert regenerated.json()["parent_turn_id"] == t1
    assert regenerated.json()["sibling_of"] == t2
    turn = await _ended(alice, sid, t2b)
    assert [m["content"] for m in turn["user_messages"]] == ["q2"]
    assert _sent(upstream) == [("user", "q1"), ("assistant", "a1"), ("user", "q2")]
    assert await _history(alice, sid) == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
        ("assistant", "a2 again"),
    ]
    turns = await _turns(alice, sid)
    assert [t["turn_id"] for t in turns] == [t1, t2b]
    assert (turns[1]["parent_turn_id"], turns[1]["siblings"], turns[1]["sibling_index"]) == (t1, [t2, t2b], 1)
    assert (turns[0]["parent_turn_id"], turns[0]["siblings"], turns[0]["sibling_index"]) == (None, [t1], 0)

    # Back to the first answer: nothing was deleted, and a new message continues that path.
    activated = await alice.post(f"/v1/sessions/{sid}/turns/{t2}/activate")
    assert activated.status_code == 200, activated.text
    assert activated.json() == {"session_id": sid, "head_turn_id": t2, "path_turn_ids": [t1, t2]}
    assert await _history(alice, sid) == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
        ("assistant", "a2"),
    ]
    upstream.enqueue(Script.text("a3"))
    t3 = await _ask(alice, sid, "q3")
    assert _sent(upstream) == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
        ("assistant", "a2"),
        ("user", "q3"),
    ]
    assert (await alice.get(f"/v1/sessions/{sid}/turns/{t3}")).json()["parent_turn_id"] == t2

    # Editing the first question: the later turns leave the active path, not storage.
    upstream.enqueue(Script.text("e1"))
    edited = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/edit", json={"content": "q1, edited"})
    assert edited.status_code == 202, edited.text
    t1b = edited.json()["turn_id"]
    assert edited.json()["parent_turn_id"] is None
    await _ended(alice, sid, t1b)
    assert _sent(upstream) == [("user", "q1, edited")]
    assert await _history(alice, sid) == [("user", "q1, edited"), ("assistant", "e1")]
    [only] = await _turns(alice, sid)
    assert (only["turn_id"], only["siblings"], only["sibling_index"]) == (t1b, [t1, t1b], 1)
    off_path = await alice.get(f"/v1/sessions/{sid}/turns/{t2b}")
    assert off_path.status_code == 200
    assert off_path.json()["final_answer"] == "a2 again"
    assert (off_path.json()["siblings"], off_path.json()["sibling_index"]) == ([t2, t2b], 1)

    # Activating the first question leads down to its most recent turn.
    activated = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/activate", json={})
    assert activated.json()["path_turn_ids"] == [t1, t2, t3]
    assert [t["turn_id"] for t in await _turns(alice, sid)] == [t1, t2, t3]
    assert len(upstream.requests) == 5


def _png(color: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (3, 2), color).save(buffer, "PNG")
    return buffer.getvalue()


def _image_urls(upstream: FakeUpstream) -> list[str]:
    """The data URLs of the images the last model request's user messages held."""
    messages = upstream.requests[-1].body["messages"]
    assert validate_history(messages) == []
    return [
        part["image_url"]["url"]
        for m in messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "image_url"
    ]


async def _file_ids(client: httpx.AsyncClient) -> set[str]:
    return {f["id"] for f in (await client.get("/v1/files")).json()["files"]}


async def test_an_edit_carries_attachments_as_a_message_does_and_a_regenerate_sends_them_again(
    alice: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    red, blue = _png("red"), _png("blue")
    uploaded = await alice.post("/v1/files", files={"file": ("red.png", red, "image/png")})
    assert uploaded.status_code == 201, uploaded.text
    red_id = uploaded.json()["id"]
    sid = await _session(alice)
    upstream.enqueue(Script.text("a1"))
    t1 = await _ask(alice, sid, "q1")

    upstream.enqueue(Script.text("two pictures"))
    blue_url = "data:image/png;base64," + base64.b64encode(blue).decode()
    body = {"content": "what are these?", "attachments": [{"file_id": red_id}, {"url": blue_url}]}
    edited = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/edit", json=body)
    assert edited.status_code == 202, edited.text
    t1b = edited.json()["turn_id"]
    turn = await _ended(alice, sid, t1b)
    shown = turn["user_messages"][0]["attachments"]
    assert [(a["name"], a["media_type"], a["size"]) for a in shown] == [
        ("red.png", "image/png", len(red)),
        ("attachment.png", "image/png", len(blue)),
    ]
    assert _image_urls(upstream) == ["data:image/png;base64," + base64.b64encode(red).decode(), blue_url]
    page = (await alice.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
    [user] = [m for m in page if m["type"] == "text" and m["role"] == "user"]
    assert user["attachments"] == shown

    # A regenerate asks the edited message again, with its files.
    upstream.enqueue(Script.text("again"))
    regenerated = await alice.post(f"/v1/sessions/{sid}/turns/{t1b}/regenerate")
    assert regenerated.status_code == 202, regenerated.text
    await _ended(alice, sid, regenerated.json()["turn_id"])
    assert _image_urls(upstream) == ["data:image/png;base64," + base64.b64encode(red).decode(), blue_url]
    requests, files = len(upstream.requests), await _file_ids(alice)

    # A model without vision cannot take them: 422 before anything is stored, for an edit or a regenerate.
    to_blind = await alice.post(f"/v1/sessions/{sid}/turns/{t1b}/regenerate", json={"model": OTHER})
    assert to_blind.status_code == 422, to_blind.text
    assert to_blind.json()["error"]["code"] == "unsupported_attachment"
    blind = (await alice.post("/v1/sessions", json={"model": OTHER})).json()["id"]
    upstream.enqueue(Script.text("b1"))
    b1 = await _ask(alice, blind, "hello")
    requests += 1
    green = "data:image/png;base64," + base64.b64encode(_png("green")).decode()
    refused = await alice.post(
        f"/v1/sessions/{blind}/turns/{b1}/edit",
        json={"content": "and this?", "attachments": [{"url": green}]},
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "unsupported_attachment"
    assert len(upstream.requests) == requests
    assert await _file_ids(alice) == files
    assert [t["turn_id"] for t in await _turns(alice, blind)] == [b1]
    too_many = {"content": "x", "attachments": [{"file_id": red_id}] * 11}
    assert (await alice.post(f"/v1/sessions/{sid}/turns/{t1b}/edit", json=too_many)).status_code == 413


async def test_branch_changed_reaches_every_open_stream(
    server: LiveServer, alice: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = await _session(alice)
    upstream.enqueue(Script.text("a1"))
    t1 = await _ask(alice, sid, "q1")
    url = f"/v1/sessions/{sid}/events"
    async with EventReader(alice, url) as first, EventReader(alice, url) as second:
        upstream.enqueue(Script.text("a1 again"))
        t1b = (await alice.post(f"/v1/sessions/{sid}/turns/{t1}/regenerate", json={})).json()["turn_id"]
        await _ended(alice, sid, t1b)
        upstream.enqueue(Script.text("edited"))
        edited = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/edit", json={"content": "other"})
        t1c = edited.json()["turn_id"]
        await _ended(alice, sid, t1c)
        assert (await alice.post(f"/v1/sessions/{sid}/turns/{t1}/activate")).status_code == 200
        for reader in (first, second):
            await reader.wait_type("branch_changed", count=3)
            changes = [(e["head_turn_id"], e["path_turn_ids"]) for e in reader.of_type("branch_changed")]
            assert changes == [(t1b, [t1b]), (t1c, [t1c]), (t1, [t1])]
            # A regenerated turn announces its opening first, then the new path.
            kinds = [
                e.event for e in reader.events if e.event in ("turn_start", "user_message", "branch_changed")
            ]
            assert kinds[:3] == ["turn_start", "user_message", "branch_changed"]
        # Activating the head again changes nothing, and says nothing.
        again = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/activate")
        assert again.json()["head_turn_id"] == t1
        upstream.enqueue(Script.text("a2"))
        await _ask(alice, sid, "q2")
        await first.wait_type("turn_done", count=3)
        assert len(first.of_type("branch_changed")) == 3


async def test_a_fork_goes_on_alone_and_leaves_the_original_unchanged(
    alice: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    settings = {"context": {"strategy": "off"}, "metadata": {"project": "apollo", "n": 3}}
    created = await alice.post(
        "/v1/sessions", json={"system_prompt": "Be brief.", "title": "origin", **settings}
    )
    sid = created.json()["id"]
    upstream.enqueue(Script.text("a1"), Script.text("a2"))
    t1 = await _ask(alice, sid, "q1")
    await _ask(alice, sid, "q2")
    before = (await alice.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]

    forked = await alice.post(f"/v1/sessions/{sid}/fork", json={"turn_id": t1})
    assert forked.status_code == 201, forked.text
    fork = forked.json()
    assert fork["id"] != sid
    assert (fork["model"], fork["system_prompt"], fork["title"], fork["tools"]) == (
        MODEL,
        "Be brief.",
        "origin",
        created.json()["tools"],
    )
    # The settings a product keeps on a session come along: its context policy, its metadata (and the list's
    # filter finds the fork by it).
    assert (fork["context"], fork["metadata"]) == (created.json()["context"], {"project": "apollo", "n": 3})
    listed = (await alice.get("/v1/sessions", params={"metadata.project": "apollo"})).json()["sessions"]
    assert {s["id"] for s in listed} == {sid, fork["id"]}
    copied = (await alice.get(f"/v1/sessions/{fork['id']}/messages")).json()["chat_messages"]
    first_turn = before[: next(i for i, m in enumerate(before) if m["type"] == "turn_done") + 1]
    assert [(m["type"], m.get("content"), m["timestamp"]) for m in copied] == [
        (m["type"], m.get("content"), m["timestamp"]) for m in first_turn
    ]
    assert not {m["id"] for m in copied} & {m["id"] for m in before}
    assert [(m["role"], m["content"]) for m in copied if m["type"] == "text"] == [
        ("user", "q1"),
        ("assistant", "a1"),
    ]

    upstream.enqueue(Script.text("fork answer"))
    await _ask(alice, fork["id"], "in the fork")
    assert _sent(upstream) == [
        ("system", "Be brief."),
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "in the fork"),
    ]
    assert (await alice.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"] == before
    upstream.enqueue(Script.text("a3"))
    await _ask(alice, sid, "q3")
    assert _sent(upstream)[-2:] == [("assistant", "a2"), ("user", "q3")]


async def test_another_principals_ids_are_not_found(
    alice: httpx.AsyncClient, bob: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = await _session(alice)
    upstream.enqueue(Script.text("a1"))
    t1 = await _ask(alice, sid, "q1")
    own = await _session(bob)
    attempts = [
        (f"/v1/sessions/{sid}/turns/{t1}/regenerate", {}),
        (f"/v1/sessions/{sid}/turns/{t1}/edit", {"content": "mine now"}),
        (f"/v1/sessions/{sid}/turns/{t1}/activate", {}),
        (f"/v1/sessions/{sid}/fork", {"turn_id": t1}),
        # Alice's turn named on Bob's own session.
        (f"/v1/sessions/{own}/turns/{t1}/regenerate", {}),
        (f"/v1/sessions/{own}/turns/{t1}/edit", {"content": "mine now"}),
        (f"/v1/sessions/{own}/turns/{t1}/activate", {}),
        (f"/v1/sessions/{own}/fork", {"turn_id": t1}),
    ]
    for path, body in attempts:
        refused = await bob.post(path, json=body)
        assert refused.status_code == 404, (path, refused.text)
        assert refused.json()["error"]["code"] == "not_found"
    assert (await bob.get(f"/v1/sessions/{own}/turns/{t1}")).status_code == 404
    assert len(upstream.requests) == 1
    assert await _history(alice, sid) == [("user", "q1"), ("assistant", "a1")]


async def test_while_a_turn_runs_branching_is_refused_unless_it_interrupts(
    alice: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = await _session(alice)
    upstream.enqueue(Script.text("a1"))
    t1 = await _ask(alice, sid, "q1")
    upstream.enqueue(Script.hang(30))
    running = (await alice.post(f"/v1/sessions/{sid}/messages", json={"content": "q2"})).json()["turn_id"]
    await upstream.await_request(lambda r: len(r.body["messages"]) == 3)
    for path, body in [
        (f"/turns/{t1}/regenerate", {}),
        (f"/turns/{t1}/edit", {"content": "again"}),
        (f"/turns/{t1}/activate", {}),
        (f"/turns/{running}/regenerate", {}),
    ]:
        refused = await alice.post(f"/v1/sessions/{sid}{path}", json=body)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["details"]["turn_id"] == running
    forked = await alice.post(f"/v1/sessions/{sid}/fork", json={"turn_id": running})
    assert forked.status_code == 409
    assert [t["turn_id"] for t in await _turns(alice, sid)] == [t1, running]

    upstream.enqueue(Script.text("a1 again"))
    regenerated = await alice.post(
        f"/v1/sessions/{sid}/turns/{t1}/regenerate", json={"delivery": "interrupt"}
    )
    assert regenerated.status_code == 202, regenerated.text
    t1b = regenerated.json()["turn_id"]
    await _ended(alice, sid, t1b)
    stopped = (await alice.get(f"/v1/sessions/{sid}/turns/{running}")).json()
    assert stopped["status"] == "cancelled"
    assert _sent(upstream) == [("user", "q1")]
    assert [t["turn_id"] for t in await _turns(alice, sid)] == [t1b]


async def test_idempotency_keys_open_one_turn_and_replay_the_answer(
    alice: httpx.AsyncClient, upstream: FakeUpstream, server: LiveServer
) -> None:
    sid = await _session(alice)
    upstream.enqueue(Script.text("a1"))
    t1 = await _ask(alice, sid, "q1")
    upstream.enqueue(Script.text("other model's answer"))
    key = {"Idempotency-Key": "regen-1"}
    first = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/regenerate", json={"model": OTHER}, headers=key)
    assert first.status_code == 202, first.text
    await _ended(alice, sid, first.json()["turn_id"])
    again = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/regenerate", json={"model": OTHER}, headers=key)
    assert (again.status_code, again.json()) == (202, first.json())
    assert again.headers["idempotent-replayed"] == "true"
    reused = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/regenerate", json={}, headers=key)
    assert reused.status_code == 422
    assert len(upstream.requests) == 2
    # The other model answered that turn only; the session keeps its own.
    assert upstream.requests[-1].body["model"] == "other-model"
    assert (await alice.get(f"/v1/sessions/{sid}")).json()["model"] == MODEL
    [turn] = await _turns(alice, sid)
    assert turn["nodes"][0]["model"] == OTHER

    key = {"Idempotency-Key": "fork-1"}
    forks = [
        await alice.post(f"/v1/sessions/{sid}/fork", json={"turn_id": t1}, headers=key) for _ in range(2)
    ]
    assert [f.status_code for f in forks] == [201, 201]
    assert forks[0].json()["id"] == forks[1].json()["id"]

    unknown = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/regenerate", json={"model": "nope/nothing"})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (422, "unknown_model")
    blank = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/edit", json={"content": "  "})
    assert blank.status_code == 422
    missing = await alice.post(f"/v1/sessions/{sid}/turns/t_000000000000/activate")
    assert missing.status_code == 404
    assert len(upstream.requests) == 2

    metrics = (await alice.get("/metrics")).text
    assert 'parley_branch_operations_total{operation="regenerate"} 1.0' in metrics
    assert 'parley_branch_operations_total{operation="fork"} 1.0' in metrics


async def test_the_sessions_context_size_follows_the_active_path(
    alice: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """context_used (and so the context percentage) is the active path's: switching to a branch shows what
    its last response reported, not the other branch's."""
    sid = await _session(alice)
    upstream.enqueue(Script.text("first", usage=(100, 5)), Script.text("second", usage=(300, 5)))
    t1 = await _ask(alice, sid, "q1")
    assert (await alice.get(f"/v1/sessions/{sid}")).json()["context_used"] == 100
    regenerated = await alice.post(f"/v1/sessions/{sid}/turns/{t1}/regenerate")
    assert regenerated.status_code == 202, regenerated.text
    t2 = regenerated.json()["turn_id"]
    await _ended(alice, sid, t2)
    assert (await alice.get(f"/v1/sessions/{sid}")).json()["context_used"] == 300
    for turn, used in ((t1, 100), (t2, 300)):
        assert (await alice.post(f"/v1/sessions/{sid}/turns/{turn}/activate")).status_code == 200
        assert (await alice.get(f"/v1/sessions/{sid}")).json()["context_used"] == used, turn
