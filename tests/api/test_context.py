"""Context compaction over a real socket (docs/context.md): sessions longer than their model's window keep
working against a strict fake upstream that refuses, as OpenAI does, any prompt over its window; every
request is a valid history within the window, and the stored history stays whole. Also the policy's
validation, GET .../context, a stop during summarisation and the offline `parley/demo-small`."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.llm.demo import DEMO_SMALL_MODEL
from app.settings import Settings
from app.storage.compaction import summary_for
from app.storage.engine import Database
from app.tools.context import ToolContext, ToolOutcome
from app.tools.external import ExternalTool
from app.tools.registry import ToolRegistry, build_default_registry
from tests.api.test_files import image, upload
from tests.fakes.upstream import FakeUpstream, RecordedRequest, Script, validate_history
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

MODEL = "openai/fake-model"
WINDOW = 3000
SUMMARY = "- The user asked about pages; the assistant read them."


class Pages:
    """A tool whose results are as long as asked: `fetch_page {"size": N}`."""

    def __init__(self) -> None:
        self.tool = ExternalTool("fetch_page", "Fetch a page.", _SIZE, "http", self._call)
        # Set: calls wait until it is released (a test acts while the tool round runs).
        self.hold: threading.Event | None = None

    async def _call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        if self.hold is not None:
            await asyncio.to_thread(self.hold.wait, 20)
        size = int(arguments.get("size", 100))
        return ToolOutcome((f"{ctx.tool_call_id} " * size)[:size], is_error=False)

    def tools(self) -> list[ExternalTool]:
        return [self.tool]

    def groups(self) -> list[str]:
        return []


_SIZE = {"type": "object", "properties": {"size": {"type": "integer"}}}


class Conversation:
    """Answers by what a request holds: a summary request gets a summary; tool results an answer; a user
    message with `fetch N` two parallel calls of N characters each, with `locate` a call of the browser's
    `get_location`; anything else a short answer."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.summary_script: Script | None = None

    def __call__(self, body: dict[str, Any]) -> Script:
        messages = body["messages"]
        last = messages[-1]
        if "[summary request]" in str(last.get("content")):
            return self.summary_script or Script.text(SUMMARY)
        if last["role"] == "tool":
            return Script.text("I read the pages.")
        words = str(last.get("content")).split()
        if words[:1] == ["locate"]:  # the browser's tool (a client tool the session declares)
            return Script.tool_calls([(f"call_{next(self.ids)}", "get_location", "{}")])
        if words[:1] == ["fetch"]:
            size = int(words[1])
            calls = [(f"call_{next(self.ids)}", "fetch_page", json.dumps({"size": size})) for _ in range(2)]
            return Script.tool_calls(calls)
        return Script.text("Noted: " + " ".join(words[:6]))


@pytest.fixture
def conversation() -> Conversation:
    return Conversation()


@pytest.fixture
def upstream(conversation: Conversation) -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True, window=WINDOW, responder=conversation) as running:
        yield running


@pytest.fixture
def configured(settings: Settings, upstream: FakeUpstream, tmp_path: Path) -> Settings:
    path = tmp_path / "models.json"
    model = {"context_window": WINDOW, "vision": True}
    models = {"fake": {"api_base": upstream.base_url, "models": {MODEL: model}}}
    path.write_text(json.dumps({"providers": models}))
    return settings.model_copy(update={"models_file": path, "default_model": MODEL})


@pytest.fixture
def pages() -> Pages:
    return Pages()


@pytest.fixture
def registry(pages: Pages) -> ToolRegistry:
    tools = build_default_registry()
    tools.add_provider(pages)
    return tools


@pytest.fixture
def server(configured: Settings, registry: ToolRegistry) -> Iterator[LiveServer]:
    with live_server(configured, registry) as running:
        yield running


async def _turns(
    client: httpx.AsyncClient, sid: str, contents: list[str], reader: EventReader
) -> list[dict[str, Any]]:
    done = len(reader.of_type("turn_done"))
    for content in contents:
        posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": content})
        assert posted.status_code == 202, posted.text
        done += 1
        await reader.wait_type("turn_done", count=done, timeout=30)
    return reader.of_type("turn_done")


async def _history(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    page = await client.get(f"/v1/sessions/{sid}/messages", params={"limit": 1000})
    assert page.status_code == 200
    messages: list[dict[str, Any]] = page.json()["chat_messages"]
    return messages


@pytest.mark.both_backends
async def test_a_long_session_with_huge_tool_results_completes_every_turn_within_the_window(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    contents = [
        f"fetch 5000 turn {n}" if n % 3 == 0 else f"Turn {n}: " + "tell me more about it " * 40
        for n in range(18)
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"tools": ["fetch_page"]})
        sid = created.json()["id"]
        assert created.json()["context"] == {"strategy": "auto", "keep_turns": 4, "reserve_tokens": 1024}
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            done = await _turns(client, sid, contents, reader)
        history = await _history(client, sid)
        context = (await client.get(f"/v1/sessions/{sid}/context")).json()
        turns = (await client.get(f"/v1/sessions/{sid}/turns", params={"limit": 100})).json()["turns"]

    assert [d["status"] for d in done] == ["completed"] * len(contents)
    # Every request the provider got was a valid history within its window: none was refused.
    for request in upstream.requests:
        assert request.problems == [], request.problems
        assert validate_history(request.body["messages"]) == []
    # The record is whole: every message, every result in full.
    assert [m["content"] for m in history if m["type"] == "text" and m["role"] == "user"] == contents
    results = [m for m in history if m["type"] == "tool_group"]
    assert len(results) == 2 * 6 and all(len(m["result"]) == 5000 for m in results)
    compacted = reader.of_type("context_compacted")
    assert compacted and any(c["summary_written"] for c in compacted)
    assert any(c["elided_tool_call_ids"] for c in compacted)
    for event in compacted:
        assert event["tokens_after"] < event["tokens_before"]
    # Announced before the model call it applies to: between the turn's start and its first response.
    types = [e.event for e in reader.events]
    first = types.index("context_compacted")
    assert "response_done" in types[first:]
    # A summary is written once every several turns, not at every turn.
    written = [c for c in compacted if c["summary_written"]]
    assert len(written) <= len(contents) // 3
    # The turn view marks the turns whose calls sent a compacted view, with what the last one sent.
    marked = {t["turn_id"]: t["compaction"] for t in turns if t["compaction"] is not None}
    assert set(marked) == {c["turn_id"] for c in compacted}
    last = compacted[-1]
    assert marked[last["turn_id"]]["summary_id"] == last["summary_id"]
    assert marked[last["turn_id"]]["tokens_after"] == last["tokens_after"]
    assert context["summary"]["content"] == SUMMARY
    assert context["summary"]["summarized_turn_ids"] == compacted[-1]["summarized_turn_ids"]
    assert context["compaction_due"] is False
    assert context["sent_tokens"] <= context["budget_tokens"] < context["history_tokens"]
    assert validate_history(context["messages"]) == []
    assert SUMMARY in context["messages"][0]["content"]
    assert len(context["verbatim_turn_ids"]) >= 4
    # token_usage reports what was sent, not the whole history.
    usage = reader.of_type("token_usage")[-1]
    assert usage["context_used"] <= WINDOW and usage["context_percent"] <= 100


async def test_a_result_bigger_than_the_window_is_elided_for_the_call_after_it(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={"tools": ["fetch_page"]})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            done = await _turns(client, sid, ["fetch 16000 now", "and then?"], reader)
        history = await _history(client, sid)
    assert [d["status"] for d in done] == ["completed", "completed"]
    assert all(r.problems == [] for r in upstream.requests)
    [first, *_] = reader.of_type("context_compacted")
    assert len(first["elided_tool_call_ids"]) >= 1 and first["summary_id"] is None
    assert all(len(m["result"]) == 16000 for m in history if m["type"] == "tool_group")


async def test_off_is_todays_behaviour_a_clear_context_window_exceeded(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post(
            "/v1/sessions", json={"tools": ["fetch_page"], "context": {"strategy": "off"}}
        )
        sid = created.json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            done = await _turns(client, sid, ["fetch 16000 now"], reader)
    assert done[-1]["status"] == "failed"
    assert reader.of_type("error")[-1]["code"] == "context_window_exceeded"
    assert reader.of_type("context_compacted") == []


async def test_a_stop_during_summarisation_leaves_no_half_summary(
    server: LiveServer, upstream: FakeUpstream, conversation: Conversation, configured: Settings
) -> None:
    conversation.summary_script = Script.hang(30)
    long = "tell me more about it " * 60

    def summarising(request: RecordedRequest) -> bool:
        return "[summary request]" in json.dumps(request.body)

    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={"context": {"keep_turns": 1}})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            for n in range(10):
                posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": f"{n} {long}"})
                assert posted.status_code == 202
                # Until the turn ends, or its summary's model call is made (the fake holds it).
                while len(reader.of_type("turn_done")) <= n:
                    if any(summarising(r) for r in upstream.requests):
                        break
                    await asyncio.sleep(0.005)
                if any(summarising(r) for r in upstream.requests):
                    break
            await upstream.await_request(summarising, within=10)
            stopped = await client.post(f"/v1/sessions/{sid}/cancel", json={})
            assert stopped.json()["cancelled"] is True
            await reader.wait_for(lambda e: e.event == "turn_done" and e.data["status"] == "cancelled")
        context = (await client.get(f"/v1/sessions/{sid}/context")).json()
        history = await _history(client, sid)
    assert reader.of_type("context_compacted") == []
    assert context["summary"] is None and context["compaction_due"] is True
    turn_ids = [m["turn_id"] for m in history if m["type"] == "turn_start"]
    database = Database(configured.database_url)
    try:
        async with database.read() as db:
            assert await summary_for(db, sid, turn_ids) is None
    finally:
        await database.dispose()
    # The user messages are all kept; the next turn summarises and answers.
    conversation.summary_script = None
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            done = await _turns(client, sid, ["and now?"], reader)
        context = (await client.get(f"/v1/sessions/{sid}/context")).json()
    assert done[-1]["status"] == "completed"
    assert context["summary"]["content"] == SUMMARY


@pytest.mark.parametrize(
    "context",
    [
        {"keep_turns": "3"},
        {"keep_turns": 2.5},
        {"keep_turns": True},
        {"keep_turns": 0},
        {"keep_turns": 101},
        {"reserve_tokens": -1},
        {"reserve_tokens": "100"},
        {"strategy": "sometimes"},
        {"window": 3},
        "auto",
    ],
)
async def test_a_wrong_policy_is_a_422_and_stores_nothing(server: LiveServer, context: Any) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        refused = await client.post("/v1/sessions", json={"context": context})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "validation_error"
        assert (await client.get("/v1/sessions")).json()["sessions"] == []
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        patched = await client.patch(f"/v1/sessions/{sid}", json={"context": context})
        assert patched.status_code == 422
        kept = await client.get(f"/v1/sessions/{sid}")
        assert kept.json()["context"] == {"strategy": "auto", "keep_turns": 4, "reserve_tokens": 1024}


async def test_the_policy_is_given_at_creation_changed_by_patch_and_defaults_from_settings(
    configured: Settings, registry: ToolRegistry
) -> None:
    settings = configured.model_copy(
        update={"context_strategy": "off", "context_keep_turns": 6, "context_reserve_tokens": 500}
    )
    with live_server(settings, registry) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            plain = (await client.post("/v1/sessions", json={})).json()
            assert plain["context"] == {"strategy": "off", "keep_turns": 6, "reserve_tokens": 500}
            given = (
                await client.post("/v1/sessions", json={"context": {"strategy": "auto", "keep_turns": 2}})
            ).json()
            assert given["context"] == {"strategy": "auto", "keep_turns": 2, "reserve_tokens": 500}
            patched = await client.patch(
                f"/v1/sessions/{given['id']}", json={"context": {"reserve_tokens": 0}}
            )
            assert patched.json()["context"] == {"strategy": "auto", "keep_turns": 2, "reserve_tokens": 0}
            nulled = await client.patch(f"/v1/sessions/{given['id']}", json={"context": None})
            assert nulled.status_code == 422
            again = await client.get(f"/v1/sessions/{given['id']}")
            assert again.json()["context"] == patched.json()["context"]
            context = (await client.get(f"/v1/sessions/{given['id']}/context")).json()
            assert context["policy"] == patched.json()["context"]
            assert context["budget_tokens"] == WINDOW and context["summary"] is None
            assert context["messages"] == []
            missing = await client.get("/v1/sessions/s_0123456789abcdef/context")
            assert missing.status_code == 404


async def test_the_small_demo_model_compacts_offline_and_keeps_all_fifty_exchanges(
    settings: Settings,
) -> None:
    with live_server(settings) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            models = (await client.get("/v1/models")).json()["models"]
            assert {
                "model": DEMO_SMALL_MODEL,
                "provider": "parley",
                "context_window": 2048,
                "source": "demo",
            } in models
            sid = (await client.post("/v1/sessions", json={"model": DEMO_SMALL_MODEL})).json()["id"]
            contents = [
                f"Message {n}: " + "a few words about the weather and my plans " * 5 for n in range(50)
            ]
            async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
                done = await _turns(client, sid, contents, reader)
            history = await _history(client, sid)
            context = (await client.get(f"/v1/sessions/{sid}/context")).json()
    assert [d["status"] for d in done] == ["completed"] * 50
    assert reader.of_type("context_compacted")
    assert context["summary"] is not None and "The user said" in context["summary"]["content"]
    assert [m["content"] for m in history if m["type"] == "text" and m["role"] == "user"] == contents
    assert len([m for m in history if m["type"] == "text" and m["role"] == "assistant"]) == 50


async def test_a_steer_mid_turn_in_a_compacted_session_keeps_every_request_valid(
    server: LiveServer, upstream: FakeUpstream, pages: Pages
) -> None:
    long = "tell me more about it " * 40
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={"tools": ["fetch_page"]})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            await _turns(client, sid, [f"Turn {n}: {long}" for n in range(8)], reader)
            pages.hold = threading.Event()
            posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "fetch 4000 now"})
            assert posted.status_code == 202
            await reader.wait_type("tool_exec_start", count=2)
            steer = await client.post(
                f"/v1/sessions/{sid}/messages", json={"content": "Also: " + long, "delivery": "steer"}
            )
            assert steer.status_code == 202 and steer.json()["queued"] is True
            pages.hold.set()
            done = await reader.wait_type("turn_done", count=10, timeout=30)
        history = await _history(client, sid)
    assert [d.data["status"] for d in done][-2:] == ["completed", "completed"]
    for request in upstream.requests:
        assert request.problems == [], request.problems
    users = [m["content"] for m in history if m["type"] == "text" and m["role"] == "user"]
    assert users[-2:] == ["fetch 4000 now", "Also: " + long]
    assert reader.of_type("context_compacted")


LOCATION = {
    "name": "get_location",
    "description": "The user's city, from the browser.",
    "parameters": {"type": "object", "properties": {}},
}


async def test_approvals_and_a_browser_tool_waiting_in_a_compacted_session_keep_every_request_valid(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    """Calls that wait for a person (approval) and for the browser (a client tool) in a session that has
    outgrown its window: the calls after each answer send a compacted view that keeps the waiting round
    whole (its assistant message with every call, then every result), within the window."""
    long = "tell me more about it " * 40
    body = {"tools": ["fetch_page"], "approval": ["fetch_page"], "client_tools": [LOCATION]}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json=body)).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            await _turns(client, sid, [f"Turn {n}: {long}" for n in range(8)], reader)
            before = len(reader.of_type("context_compacted"))
            assert before, "the session did not outgrow its window"
            posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "fetch 2000 now"})
            assert posted.status_code == 202
            asked = await reader.wait_type("approval_requested", count=2, timeout=30)
            decisions = [{"tool_call_id": e.data["tool_call_id"], "decision": "approve"} for e in asked]
            approved = await client.post(f"/v1/sessions/{sid}/approvals", json={"decisions": decisions})
            assert approved.status_code == 200, approved.text
            await reader.wait_type("turn_done", count=9, timeout=30)
            posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "locate me"})
            assert posted.status_code == 202
            (wanted,) = await reader.wait_type("client_tool_requested", timeout=30)
            answer = {"tool_call_id": wanted.data["tool_call_id"], "output": {"city": "Paris"}}
            answered = await client.post(f"/v1/sessions/{sid}/tool_results", json={"results": [answer]})
            assert answered.status_code == 200, answered.text
            done = await reader.wait_type("turn_done", count=10, timeout=30)
        history = await _history(client, sid)
    assert [d.data["status"] for d in done] == ["completed"] * 10
    for request in upstream.requests:
        assert request.problems == [], request.problems
        assert validate_history(request.body["messages"]) == []
    # The calls after the approval and after the browser's answer were compacted views, and valid.
    assert len(reader.of_type("context_compacted")) > before
    last = upstream.requests[-1].body["messages"]
    assert last[-1]["role"] == "tool" and "Paris" in last[-1]["content"]
    results = [m for m in history if m["type"] == "tool_group"]
    assert [m["decision"] for m in results[:2]] == ["approve", "approve"]
    assert all(len(m["result"]) == 2000 for m in results[:2])
    assert results[-1]["tool_name"] == "get_location"


async def test_an_image_far_back_is_sent_as_a_placeholder_that_names_it(
    server: LiveServer, upstream: FakeUpstream
) -> None:
    photo = image(size=(64, 48), color="blue")
    encoded = base64.b64encode(photo).decode()
    long = "tell me more about it " * 40
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        file = (await upload(client, "beach.png", photo, "image/png")).json()
        sid = (await client.post("/v1/sessions", json={"context": {"keep_turns": 2}})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            first = {"content": "Look at this photo.", "attachments": [{"file_id": file["id"]}]}
            posted = await client.post(f"/v1/sessions/{sid}/messages", json=first)
            assert posted.status_code == 202, posted.text
            await reader.wait_type("turn_done", timeout=30)
            shown = (await client.get(f"/v1/sessions/{sid}/context")).json()
            # Until a call sent the placeholder, and the next one would too (GET .../context).
            for n in range(10):
                await _turns(client, sid, [f"Turn {n}: {long}"], reader)
                later = (await client.get(f"/v1/sessions/{sid}/context")).json()
                if later["elided_file_ids"] and any(
                    c["elided_file_ids"] for c in reader.of_type("context_compacted")
                ):
                    break
        history = await _history(client, sid)
        turns = (await client.get(f"/v1/sessions/{sid}/turns", params={"limit": 100})).json()["turns"]

    # GET .../context shows the photo by its URL while it is sent, then the placeholder; never its bytes.
    url = f"/v1/files/{file['id']}/content"
    assert shown["elided_file_ids"] == [] and url in json.dumps(shown["messages"])
    assert later["elided_file_ids"] == [file["id"]] and url not in json.dumps(later["messages"])
    assert "Parley elided the attached file beach.png" in json.dumps(later["messages"])
    assert encoded not in json.dumps(shown) + json.dumps(later)
    assert all(d["status"] == "completed" for d in reader.of_type("turn_done"))
    [compacted, *_] = [c for c in reader.of_type("context_compacted") if c["elided_file_ids"]]
    assert compacted["elided_file_ids"] == [file["id"]] and compacted["summary_id"] is None
    # The first calls sent the photo itself; from the compaction on, a placeholder that names it.
    sent = [json.dumps(r.body["messages"]) for r in upstream.requests]
    assert encoded in sent[0]
    elided = [s for s in sent if "Parley elided the attached file beach.png" in s]
    assert elided and sent[-1] == elided[-1]
    for text in elided:
        assert encoded not in text and "image/png" in text and file["id"] in text
    for request in upstream.requests:
        assert request.problems == [], request.problems
        assert validate_history(request.body["messages"]) == []
    # The record is whole: the first message still has its photo; the turn view names the elision.
    [user, *_] = [m for m in history if m["type"] == "text" and m["role"] == "user"]
    assert [a["file_id"] for a in user["attachments"]] == [file["id"]]
    marked = {t["turn_id"]: t["compaction"] for t in turns if t["compaction"] is not None}
    assert file["id"] in marked[compacted["turn_id"]]["elided_file_ids"]
