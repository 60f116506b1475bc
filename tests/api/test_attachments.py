"""Attachments on messages over real HTTP (docs/files.md): what the events, the history and the turn view
show of them (never the bytes), data URLs stored as files, what the demo model says it received, the exact
bytes reaching a strict fake OpenAI-compatible upstream and the fake Anthropic Messages API as their
native parts, refusals (a model without vision, too many attachments) that store nothing, a file in use
that cannot be deleted, and a deleted session's files going with it unless another session uses them."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.api.test_files import PDF, counts, image, upload
from tests.fakes.upstream import FakeUpstream, Script
from tests.support.pdf import make_pdf
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

OPENAI_VISION = "openai/fake-vision"
OPENAI_BLIND = "openai/fake-blind"
CLAUDE = "anthropic/claude-fake"
KEY = "sk-test"


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key=KEY, strict=True) as running:
        yield running


@pytest.fixture
def configured(
    settings: Settings, upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("PARLEY_TEST_FAKE_KEY", KEY)
    path = tmp_path / "models.json"
    providers = {
        "fake": {
            "api_base": upstream.base_url,
            "api_key_env": "PARLEY_TEST_FAKE_KEY",
            "context_window": 100_000,
            "models": {OPENAI_VISION: {"vision": True, "documents": True}, OPENAI_BLIND: {"vision": False}},
        },
        "claude": {
            "api_base": upstream.root_url,
            "api_key_env": "PARLEY_TEST_FAKE_KEY",
            "context_window": 200_000,
            "max_output_tokens": 1024,
            "vision": True,
            "documents": True,
            "models": [CLAUDE],
        },
    }
    path.write_text(json.dumps({"providers": providers}), encoding="utf-8")
    return settings.model_copy(update={"models_file": path, "files_max_attachments": 3})


@pytest.fixture
def server(configured: Settings) -> Iterator[LiveServer]:
    with live_server(configured) as running:
        yield running


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        yield http


async def _session(client: httpx.AsyncClient, model: str = "parley/demo") -> str:
    created = await client.post("/v1/sessions", json={"model": model})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


async def _turn(
    client: httpx.AsyncClient, sid: str, body: dict[str, Any]
) -> tuple[dict[str, Any], EventReader]:
    async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
        posted = await client.post(f"/v1/sessions/{sid}/messages", json=body)
        assert posted.status_code == 202, posted.text
        await reader.wait_type("turn_done")
    return posted.json(), reader


def _text(reader: EventReader) -> str:
    return "".join(d["text"] for d in reader.of_type("text_delta"))


def _data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


async def test_the_demo_model_describes_what_it_received_and_every_view_shows_the_files(
    client: httpx.AsyncClient,
) -> None:
    png = image(size=(64, 48))
    shot = (await upload(client, "screen shot.png", png, "image/png")).json()
    notes = (await upload(client, "notes.md", b"# Notes\nremember the milk\n")).json()
    sid = await _session(client)
    accepted, reader = await _turn(
        client,
        sid,
        {"content": "What is in these?", "attachments": [{"file_id": shot["id"]}, {"file_id": notes["id"]}]},
    )
    shown = [
        {
            "file_id": shot["id"],
            "name": "screen shot.png",
            "media_type": "image/png",
            "size": len(png),
            "width": 64,
            "height": 48,
        },
        {
            "file_id": notes["id"],
            "name": "notes.md",
            "media_type": "text/markdown",
            "size": 26,
            "width": None,
            "height": None,
        },
    ]
    assert accepted["attachments"] == shown
    [event] = reader.of_type("user_message")
    assert event["attachments"] == shown
    assert _text(reader).startswith(
        f"I received 2 files: screen shot.png (image/png, {len(png)} bytes, 64x48 pixels); "
        "notes.md (text/markdown, 26 bytes). You said: What is in these?"
    )
    history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
    [user] = [m for m in history if m["type"] == "text" and m["role"] == "user"]
    assert user["attachments"] == shown
    turn = (await client.get(f"/v1/sessions/{sid}/turns/{accepted['turn_id']}")).json()
    assert turn["user_messages"][0]["attachments"] == shown
    # Never the bytes: no event or view holds the image's base64.
    encoded = base64.b64encode(png).decode()[:40]
    assert encoded not in json.dumps([history, turn, [e.data for e in reader.events]])
    # A message without attachments shows an empty list.
    _, plain = await _turn(client, sid, {"content": "and now?"})
    assert plain.of_type("user_message")[0]["attachments"] == []


async def test_a_data_url_is_stored_as_a_file_first(client: httpx.AsyncClient, configured: Settings) -> None:
    png = image(size=(10, 20), color="yellow")
    sid = await _session(client)
    accepted, reader = await _turn(
        client, sid, {"content": "pasted", "attachments": [{"url": _data_url("image/png", png)}]}
    )
    [attachment] = accepted["attachments"]
    assert attachment["name"] == "attachment.png" and (attachment["width"], attachment["height"]) == (10, 20)
    stored = (await client.get(f"/v1/files/{attachment['file_id']}")).json()
    assert stored["size"] == len(png)
    assert (await client.get(f"/v1/files/{attachment['file_id']}/content")).content == png
    assert "attachment.png (image/png" in _text(reader)


@pytest.mark.parametrize(
    "attachments",
    [
        [{"url": _data_url("image/png", b"\x7fELF\x02\x01\x01\x00not a png")}],  # 415
        [{"url": "data:image/png;base64,!!!notbase64"}],  # 422 (the schema's pattern)
        [{"file_id": "f_0000000000000000"}],  # 404
        [{"url": _data_url("text/plain", b"a")}, {"url": _data_url("text/plain", b"b")}]
        * 2,  # 413: more than 3
    ],
)
async def test_a_refused_attachment_stores_nothing(
    client: httpx.AsyncClient, configured: Settings, attachments: list[dict[str, str]]
) -> None:
    sid = await _session(client)
    posted = await client.post(
        f"/v1/sessions/{sid}/messages", json={"content": "look", "attachments": attachments}
    )
    assert posted.status_code in (404, 413, 415, 422), posted.text
    assert counts(configured) == (0, 0)
    assert (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"] == []


async def test_a_model_without_vision_is_422_before_anything_is_stored(
    client: httpx.AsyncClient, configured: Settings, upstream: FakeUpstream
) -> None:
    sid = await _session(client, OPENAI_BLIND)
    png = image()
    posted = await client.post(
        f"/v1/sessions/{sid}/messages",
        json={"content": "see?", "attachments": [{"url": _data_url("image/png", png)}]},
    )
    assert posted.status_code == 422, posted.text
    assert posted.json()["error"]["code"] == "unsupported_attachment"
    assert counts(configured) == (0, 0)
    # An uploaded image is refused the same way; a text file is fine for any model.
    shot = (await upload(client, "a.png", png)).json()
    posted = await client.post(
        f"/v1/sessions/{sid}/messages", json={"content": "see?", "attachments": [{"file_id": shot["id"]}]}
    )
    assert posted.status_code == 422
    assert (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"] == []
    assert upstream.requests == []
    text = (await upload(client, "a.txt", b"just words")).json()
    await _turn(client, sid, {"content": "read it", "attachments": [{"file_id": text["id"]}]})
    [request] = upstream.requests
    assert request.body["messages"][-1]["content"] == [
        {"type": "text", "text": "read it"},
        {"type": "text", "text": "[Attached file: a.txt (text/plain, 10 bytes)]\njust words"},
    ]


async def test_a_pdf_for_a_model_without_documents_is_422_unless_its_text_is_sent(
    configured: Settings, upstream: FakeUpstream, client: httpx.AsyncClient
) -> None:
    pdf = make_pdf([["Quarterly report", "Revenue grew."], ["Costs fell."]], compress=True)
    sid = await _session(client, OPENAI_BLIND)
    refused = await client.post(
        f"/v1/sessions/{sid}/messages",
        json={"content": "summarise", "attachments": [{"url": _data_url("application/pdf", pdf)}]},
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "unsupported_attachment"
    assert counts(configured) == (0, 0)


async def test_with_pdf_text_a_model_without_documents_is_sent_the_pdfs_text(
    configured: Settings, upstream: FakeUpstream
) -> None:
    pdf = make_pdf([["Quarterly report", "Revenue grew."], ["Costs fell."]], compress=True)
    with live_server(configured.model_copy(update={"files_pdf_text": True})) as running:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=30) as client:
            report = (await upload(client, "report.pdf", pdf)).json()
            sid = await _session(client, OPENAI_BLIND)
            upstream.enqueue(Script.text("Revenue up, costs down."))
            await _turn(client, sid, {"content": "summarise", "attachments": [{"file_id": report["id"]}]})
    [request] = upstream.requests
    assert request.status == 200, request.problems
    assert request.body["messages"][-1]["content"] == [
        {"type": "text", "text": "summarise"},
        {
            "type": "text",
            "text": f"[Attached file: report.pdf (application/pdf, {len(pdf)} bytes)] [its text, extracted]\n"
            "Quarterly report\nRevenue grew.\n\nCosts fell.",
        },
    ]


async def test_images_and_pdfs_reach_an_openai_compatible_model_as_native_parts(
    client: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    png = image(size=(33, 11), color="purple")
    shot = (await upload(client, "chart.png", png)).json()
    paper = (await upload(client, "paper.pdf", PDF)).json()
    sid = await _session(client, OPENAI_VISION)
    upstream.enqueue(Script.text("A purple chart and a paper."))
    _, reader = await _turn(
        client,
        sid,
        {"content": "Describe", "attachments": [{"file_id": shot["id"]}, {"file_id": paper["id"]}]},
    )
    assert _text(reader) == "A purple chart and a paper."
    [request] = upstream.requests
    assert request.status == 200, request.problems
    content = request.body["messages"][-1]["content"]
    assert content == [
        {"type": "text", "text": "Describe"},
        {"type": "text", "text": f"[Attached file: chart.png (image/png, {len(png)} bytes, 33x11 pixels)]"},
        {"type": "image_url", "image_url": {"url": _data_url("image/png", png)}},
        {"type": "text", "text": f"[Attached file: paper.pdf (application/pdf, {len(PDF)} bytes)]"},
        {"type": "file", "file": {"filename": "paper.pdf", "file_data": _data_url("application/pdf", PDF)}},
    ]
    # The next turn sends the history with the files again.
    upstream.enqueue(Script.text("Still purple."))
    await _turn(client, sid, {"content": "And again?"})
    again = upstream.requests[-1].body["messages"]
    assert again[0]["content"] == content


async def test_images_and_pdfs_reach_anthropic_as_image_and_document_blocks(
    client: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    png = image(size=(5, 9), color="white")
    shot = (await upload(client, "tiny.png", png)).json()
    sid = await _session(client, CLAUDE)
    upstream.enqueue(Script.text("A white square and a document."))
    _, reader = await _turn(
        client,
        sid,
        {
            "content": "What are these?",
            "attachments": [{"file_id": shot["id"]}, {"url": _data_url("application/pdf", PDF)}],
        },
    )
    assert _text(reader) == "A white square and a document."
    [request] = upstream.requests
    assert request.path == "/v1/messages"
    assert request.problems == [] and request.status == 200
    blocks = request.body["messages"][-1]["content"]
    images = [b for b in blocks if b["type"] == "image"]
    documents = [b for b in blocks if b["type"] == "document"]
    assert [base64.b64decode(b["source"]["data"]) for b in images] == [png]
    assert images[0]["source"]["media_type"] == "image/png"
    assert [base64.b64decode(b["source"]["data"]) for b in documents] == [PDF]
    assert documents[0]["source"]["media_type"] == "application/pdf"
    assert documents[0]["title"] == "attachment.pdf"


async def test_a_file_in_use_cannot_be_deleted_and_goes_with_its_last_session(
    client: httpx.AsyncClient, configured: Settings
) -> None:
    shared = (await upload(client, "shared.txt", b"used twice")).json()["id"]
    own = (await upload(client, "own.txt", b"used once")).json()["id"]
    kept = (await upload(client, "unused.txt", b"never attached")).json()["id"]
    first, second = await _session(client), await _session(client)
    await _turn(client, first, {"content": "one", "attachments": [{"file_id": shared}, {"file_id": own}]})
    await _turn(client, second, {"content": "two", "attachments": [{"file_id": shared}]})
    refused = await client.delete(f"/v1/files/{own}")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "file_in_use"
    assert (await client.delete(f"/v1/sessions/{first}")).status_code == 204
    assert (await client.get(f"/v1/files/{own}")).status_code == 404
    assert (await client.get(f"/v1/files/{shared}")).status_code == 200
    assert (await client.delete(f"/v1/files/{shared}")).status_code == 409
    assert (await client.delete(f"/v1/sessions/{second}")).status_code == 204
    assert (await client.get(f"/v1/files/{shared}")).status_code == 404
    assert (await client.get(f"/v1/files/{kept}")).status_code == 200
    with sqlite3.connect(configured.database_url.split("///", 1)[1]) as connection:
        assert connection.execute("SELECT count(*) FROM message_files").fetchone()[0] == 0
    assert counts(configured) == (1, 1)


async def test_a_waiting_message_keeps_its_attachments_and_a_withdrawn_one_frees_them(
    client: httpx.AsyncClient, configured: Settings
) -> None:
    created = await client.post("/v1/sessions", json={"approval": ["current_time"]})
    sid = created.json()["id"]
    note = (await upload(client, "later.txt", b"read me later")).json()["id"]
    async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
        # The turn waits for a person's approval of its call: the next message waits behind it.
        first = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "what time is it?"})
        await reader.wait_type("approval_requested")
        queued = await client.post(
            f"/v1/sessions/{sid}/messages",
            json={"content": "second", "delivery": "queue", "attachments": [{"file_id": note}]},
        )
        assert first.status_code == queued.status_code == 202
        assert queued.json()["queued"] is True
        assert queued.json()["attachments"][0]["file_id"] == note
        waiting = [e for e in reader.of_type("user_message") if e["queued"]]
        if not waiting:
            await reader.wait_for(lambda e: e.event == "user_message" and e.data["queued"])
            waiting = [e for e in reader.of_type("user_message") if e["queued"]]
        assert waiting[0]["attachments"][0]["file_id"] == note
        assert (await client.delete(f"/v1/files/{note}")).status_code == 409
        withdrawn = await client.delete(f"/v1/sessions/{sid}/queue/{queued.json()['id']}")
        assert withdrawn.status_code == 200, withdrawn.text
        await client.post(f"/v1/sessions/{sid}/cancel")
    assert (await client.delete(f"/v1/files/{note}")).status_code == 204
