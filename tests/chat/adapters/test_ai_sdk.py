"""The AI SDK adapter over a real socket, read as the kit reads it (`data:` lines, `[DONE]` last): the turn
as UI message chunks, Parley's own stream and history seeing the same turn, the chat id bound per
principal, the version's chunk set, resume, and what a request may not do (it stores nothing)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.chat.adapters.ai_sdk import DONE
from app.chat.kit_chats import NoNewInput
from app.protocol.ai_sdk import STREAM_HEADER, knows_chunk
from app.settings import Settings
from tests.support.server import LiveServer, live_server

pytestmark = pytest.mark.anyio

KEYS = "alice:alice-key-0123456789abcdef,bob:bob-key-0123456789abcdef0"
ALICE = {"Authorization": "Bearer alice-key-0123456789abcdef"}
BOB = {"Authorization": "Bearer bob-key-0123456789abcdef0"}


@pytest.fixture
def paced(database_url: str) -> Iterator[LiveServer]:
    """A server whose demo model streams at its default pace: a turn lasts long enough to stop or leave."""
    with live_server(Settings(database_url=database_url)) as server:
        yield server


def chat(chat_id: str, text: str, **extra: Any) -> dict[str, Any]:
    user = {"id": f"u-{len(text)}", "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": chat_id, "messages": [user], "trigger": "submit-message", **extra}


async def read_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    """The stream's chunks; asserts that `[DONE]` came last and that every line is a `data:` line (or a
    blank line between frames)."""
    lines = [line async for line in response.aiter_lines()]
    data = [line.removeprefix("data: ") for line in lines if line]
    assert all(line.startswith("data: ") for line in lines if line), lines
    assert data[-1] == DONE.decode().strip().removeprefix("data: ")
    return [json.loads(item) for item in data[:-1]]


async def post_chat(client: httpx.AsyncClient, body: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    async with client.stream("POST", "/v1/ai-sdk/chat", json=body, **kwargs) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers[STREAM_HEADER] == "v1"
        return await read_chunks(response)


@pytest.mark.both_backends
async def test_a_turn_is_one_assistant_message_and_parleys_own_history(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        chunks = await post_chat(client, chat("c-1", "what time is it?"))
        types = [c["type"] for c in chunks]
        assert types[0] == "start" and types[-1] == "finish"
        assert chunks[-1]["finishReason"] == "stop"
        session_id = next(c for c in chunks if c["type"] == "data-parley-session")["data"]["sessionId"]
        turn_id = chunks[0]["messageId"]
        # One step per model call, text opened and closed around its deltas, the tool's input then output.
        assert types.count("start-step") == types.count("finish-step") == 2
        assert types.count("text-start") == types.count("text-end") == 2
        order = [t for t in types if t.startswith("tool-")]
        assert order == [
            "tool-input-start",
            "tool-input-delta",
            "tool-input-available",
            "tool-output-available",
        ]
        assert all(c.get("transient") for c in chunks if c["type"].startswith("data-"))
        text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")

        # The same turn in Parley's own routes, and the kit's history built from them.
        turn = (await client.get(f"/v1/sessions/{session_id}/turns/{turn_id}")).json()
        assert turn["status"] == "completed"
        assert "".join(n["content"] for n in turn["nodes"] if n["kind"] == "llm") == text
        history = (await client.get("/v1/ai-sdk/chat/c-1/messages")).json()
        assert [m["role"] for m in history] == ["user", "assistant"]
        assert history[0]["id"] == "u-16"  # the kit's own message id, kept as client_message_id
        assert history[1]["id"] == turn_id
        parts = [p["type"] for p in history[1]["parts"]]
        assert parts == ["step-start", "text", "tool-current_time", "step-start", "text"]

        # The same chat id finds the same session again.
        again = await post_chat(client, chat("c-1", "hello"))
        assert next(c for c in again if c["type"] == "data-parley-session")["data"]["sessionId"] == session_id
        assert (await client.get("/v1/ai-sdk/chat/c-1/stream")).status_code == 204


async def test_an_existing_session_id_is_its_own_chat(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        session_id = (await client.post("/v1/sessions", json={})).json()["id"]
        chunks = await post_chat(client, chat(session_id, "hello"))
        assert (
            next(c for c in chunks if c["type"] == "data-parley-session")["data"]["sessionId"] == session_id
        )


async def test_chat_ids_are_per_principal(database_url: str) -> None:
    settings = Settings(database_url=database_url, demo_token_delay=0.0, api_keys=KEYS)
    with live_server(settings) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            mine = await post_chat(client, chat("shared-id", "hello"), headers=ALICE)
            alice_session = next(c for c in mine if c["type"] == "data-parley-session")["data"]["sessionId"]
            # Bob's chat of the same id is his own session; Alice's session id is nothing to him.
            theirs = await post_chat(client, chat("shared-id", "hi"), headers=BOB)
            bob_session = next(c for c in theirs if c["type"] == "data-parley-session")["data"]["sessionId"]
            assert bob_session != alice_session
            assert (await client.get("/v1/ai-sdk/chat/shared-id/messages", headers=BOB)).json()[0]["parts"][
                0
            ]["text"] == "hi"
            stolen = await post_chat(client, chat(alice_session, "peek"), headers=BOB)
            session = next(c for c in stolen if c["type"] == "data-parley-session")["data"]["sessionId"]
            assert session not in (alice_session, bob_session)
            history = (await client.get(f"/v1/sessions/{alice_session}/messages", headers=ALICE)).json()
            assert [
                m["content"] for m in history["chat_messages"] if m["type"] == "text" and m["role"] == "user"
            ] == ["hello"]
            # For Bob that id is a chat id like any other: his own chat, with his message only.
            peeked = (await client.get(f"/v1/ai-sdk/chat/{alice_session}/messages", headers=BOB)).json()
            assert [m["parts"][0]["text"] for m in peeked if m["role"] == "user"] == ["peek"]
            no_key = await client.post("/v1/ai-sdk/chat", json=chat("x", "hello"))
            assert no_key.status_code == 401


async def test_racing_first_requests_of_one_chat_share_its_session(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        answers = await asyncio.gather(*(post_chat(client, chat("race", f"hello {n}")) for n in range(4)))
        sessions = {
            next(c for c in a if c["type"] == "data-parley-session")["data"]["sessionId"] for a in answers
        }
        assert len(sessions) == 1
        listed = (await client.get("/v1/sessions")).json()["sessions"]
        assert [s["id"] for s in listed] == list(sessions)  # the losers' sessions are gone


@pytest.mark.parametrize("version", [5, 6, 7])
async def test_each_version_gets_only_the_chunks_it_knows(paced: LiveServer, version: int) -> None:
    async with httpx.AsyncClient(base_url=paced.base_url, timeout=30) as client:
        started = asyncio.Event()
        session: dict[str, str] = {}

        async def read() -> list[dict[str, Any]]:
            body = chat(f"v{version}", "[long] go on")
            async with client.stream("POST", f"/v1/ai-sdk/chat?v={version}", json=body) as response:
                chunks: list[dict[str, Any]] = []
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line.removeprefix("data: ")))
                        if chunks[-1]["type"] == "data-parley-session":
                            session.update(chunks[-1]["data"])
                        if chunks[-1]["type"] == "text-delta":
                            started.set()
                return chunks

        reading = asyncio.create_task(read())
        await asyncio.wait_for(started.wait(), 10)
        cancelled = await client.post(f"/v1/sessions/{session['sessionId']}/cancel")
        assert cancelled.status_code == 202
        chunks = await reading
        assert all(knows_chunk(version, c["type"]) for c in chunks)
        # A stop is the kit's `abort`; its reason only for the majors whose schema has it.
        assert chunks[-1] == ({"type": "abort", "reason": "cancelled"} if version >= 6 else {"type": "abort"})


async def test_resume_replays_the_running_turn_from_its_start(paced: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=paced.base_url, timeout=30) as client:
        async with client.stream("POST", "/v1/ai-sdk/chat", json=chat("r-1", "[slow] hello there")) as first:
            async for line in first.aiter_lines():
                if '"text-delta"' in line:
                    break  # the page reloads: the request is gone, the turn goes on
        async with client.stream("GET", "/v1/ai-sdk/chat/r-1/stream") as resumed:
            assert resumed.status_code == 200
            assert resumed.headers[STREAM_HEADER] == "v1"
            chunks = await read_chunks(resumed)
        assert chunks[0]["type"] == "start" and chunks[-1]["type"] == "finish"
        text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
        history = (await client.get("/v1/ai-sdk/chat/r-1/messages")).json()
        assert history[-1]["parts"][-1]["text"] == text
        assert (await client.get("/v1/ai-sdk/chat/r-1/stream")).status_code == 204
        assert (await client.get("/v1/ai-sdk/chat/never-used/stream")).status_code == 204


async def test_an_approval_ends_the_answer_from_major_6_and_a_replay_passes_one_answered(
    paced: LiveServer,
) -> None:
    """From major 6 an approval that waits ends the request's answer (the kit's own approval flow), and so
    does the resume's replay while it waits; once answered (here on Parley's own route) a replay goes past
    it to the end of the turn."""
    async with httpx.AsyncClient(base_url=paced.base_url, timeout=30) as client:
        session_id = (await client.post("/v1/sessions", json={"approval": ["current_time"]})).json()["id"]
        chunks = await post_chat(client, chat(session_id, "[slow] what time is it?"), params={"v": "6"})
        (asked,) = [c for c in chunks if c["type"] == "tool-approval-request"]
        assert asked == {
            "type": "tool-approval-request",
            "approvalId": asked["toolCallId"],
            "toolCallId": asked["toolCallId"],
        }
        assert chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}
        async with client.stream("GET", f"/v1/ai-sdk/chat/{session_id}/stream") as waiting:
            replayed = await read_chunks(waiting)
        assert [c["type"] for c in replayed] == [c["type"] for c in chunks]

        decision = {"decisions": [{"tool_call_id": asked["toolCallId"], "decision": "approve"}]}
        assert (await client.post(f"/v1/sessions/{session_id}/approvals", json=decision)).status_code == 200
        async with client.stream("GET", f"/v1/ai-sdk/chat/{session_id}/stream") as going_on:
            assert going_on.status_code == 200  # the slow answer after the tool still streams
            resumed = await read_chunks(going_on)
        types = [c["type"] for c in resumed]
        assert types.index("tool-approval-request") < types.index("tool-output-available")
        assert resumed[-1] == {"type": "finish", "finishReason": "stop"}


async def test_the_kits_approval_response_is_parleys_decision_once(server: LiveServer) -> None:
    """The kit's next request after `addToolApprovalResponse` (its assistant message, the tool part
    `approval-responded`): a denial is a reject with its reason, the same turn goes on in the same message;
    the same response sent again answers nothing that waits (409)."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        session_id = (await client.post("/v1/sessions", json={"approval": ["current_time"]})).json()["id"]
        user = chat(session_id, "what time is it?")["messages"][0]
        first = await post_chat(client, chat(session_id, "what time is it?"))
        (asked,) = [c for c in first if c["type"] == "tool-approval-request"]
        call_id = asked["toolCallId"]
        turn_id = first[0]["messageId"]
        part = {
            "type": "tool-current_time",
            "toolCallId": call_id,
            "state": "approval-responded",
            "input": {"timezone": "UTC"},
            "approval": {"id": asked["approvalId"], "approved": False, "reason": "not now"},
        }
        assistant = {"id": turn_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
        body = {
            "id": session_id,
            "messages": [user, assistant],
            "trigger": "submit-message",
            "messageId": turn_id,
        }
        then = await post_chat(client, body)
        assert then[0] == {"type": "start", "messageId": turn_id}
        (denied,) = [c for c in then if c["type"] == "tool-output-error"]
        assert denied["toolCallId"] == call_id and "not now" in denied["errorText"]
        text = "".join(c["delta"] for c in then if c["type"] == "text-delta")
        assert text == "You rejected the current_time call (your reason: not now), so I did not run it."
        assert then[-1] == {"type": "finish", "finishReason": "stop"}
        history = (await client.get(f"/v1/sessions/{session_id}/messages")).json()["chat_messages"]
        assert [m["decision"] for m in history if m["type"] == "tool_group"] == ["reject"]

        again = await client.post("/v1/ai-sdk/chat", json=body)
        assert again.status_code == 409 and again.json()["error"]["code"] == "no_new_input"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"trigger": "regenerate-message", "messageId": ""}, "at least 1"),
        ({"messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "  "}]}]}, "no text"),
        ({"messages": [{"id": "u", "role": "user", "parts": [{"type": "file", "url": "x"}]}]}, "mediaType"),
        ({"messages": []}, "at least 1"),
        ({"extra": 1}, "Extra inputs"),
    ],
)
async def test_what_a_request_may_not_do_is_a_clear_422_that_stores_nothing(
    server: LiveServer, change: dict[str, Any], says: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        refused = await client.post("/v1/ai-sdk/chat", json={**chat("bad", "hello"), **change})
        assert refused.status_code == 422, refused.text
        assert says in json.dumps(refused.json()["error"]["details"])
        assert (await client.get("/v1/sessions")).json()["sessions"] == []


async def test_an_assistant_message_that_answers_nothing_is_a_409(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        await post_chat(client, chat("n-1", "hello"))
        assistant = {"id": "a", "role": "assistant", "parts": [{"type": "text", "text": "hi"}]}
        body = {"id": "n-1", "messages": [assistant], "trigger": "submit-message"}
        refused = await client.post("/v1/ai-sdk/chat", json=body)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == NoNewInput.code == "no_new_input"
        for version in ("4", "8", "7.0", "x"):
            assert (
                await client.post(f"/v1/ai-sdk/chat?v={version}", json=chat("n-1", "hi"))
            ).status_code == 422


async def test_a_message_too_long_is_a_413_that_binds_no_session(database_url: str) -> None:
    settings = Settings(database_url=database_url, demo_token_delay=0.0, max_message_chars=10)
    with live_server(settings) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            refused = await client.post("/v1/ai-sdk/chat", json=chat("long", "x" * 11))
            assert refused.status_code == 413
            agui = {
                "threadId": "long",
                "runId": "r",
                "messages": [{"id": "u", "role": "user", "content": "x" * 11}],
            }
            assert (await client.post("/v1/ag-ui", json=agui)).status_code == 413
            assert (await client.get("/v1/sessions")).json()["sessions"] == []


@pytest.mark.both_backends
async def test_regenerate_and_edit_make_branches_and_the_history_follows_the_active_path(
    server: LiveServer,
) -> None:
    """What `regenerate()` and `sendMessage(..., {messageId})` post: a new sibling turn each, streamed as the
    answer, the history (Parley's and the kit's) on the new branch, the old answer kept as a sibling."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        first = await post_chat(client, chat("b-1", "hello"))
        first_turn = first[0]["messageId"]
        session_id = next(c for c in first if c["type"] == "data-parley-session")["data"]["sessionId"]
        user = chat("b-1", "hello")["messages"][0]

        again = await post_chat(
            client,
            {"id": "b-1", "messages": [user], "trigger": "regenerate-message", "messageId": first_turn},
        )
        second_turn = again[0]["messageId"]
        assert second_turn != first_turn and again[-1]["type"] == "finish"
        turn = (await client.get(f"/v1/sessions/{session_id}/turns/{second_turn}")).json()
        assert turn["siblings"] == [first_turn, second_turn] and turn["sibling_index"] == 1
        history = (await client.get("/v1/ai-sdk/chat/b-1/messages")).json()
        assert [m["id"] for m in history] == ["u-5", second_turn]

        edited = {"id": "u-5", "role": "user", "parts": [{"type": "text", "text": "what is 2+3?"}]}
        edit = await post_chat(
            client, {"id": "b-1", "messages": [edited], "trigger": "submit-message", "messageId": "u-5"}
        )
        third_turn = edit[0]["messageId"]
        assert any(c["type"] == "tool-input-available" and c["toolName"] == "calculate" for c in edit)
        turn = (await client.get(f"/v1/sessions/{session_id}/turns/{third_turn}")).json()
        assert turn["siblings"] == [first_turn, second_turn, third_turn]
        history = (await client.get("/v1/ai-sdk/chat/b-1/messages")).json()
        assert [m["role"] for m in history] == ["user", "assistant"]
        assert history[0]["parts"][-1]["text"] == "what is 2+3?" and history[1]["id"] == third_turn

        # A new user message whose id is not on the path, sent with its own id as messageId: a message.
        fresh_user = {"id": "u-new", "role": "user", "parts": [{"type": "text", "text": "and now?"}]}
        plain = await post_chat(
            client, {"id": "b-1", "messages": [fresh_user], "trigger": "submit-message", "messageId": "u-new"}
        )
        turn = (await client.get(f"/v1/sessions/{session_id}/turns/{plain[0]['messageId']}")).json()
        assert turn["parent_turn_id"] == third_turn and turn["siblings"] == [plain[0]["messageId"]]

        # Unknown message ids and chats are 404s that store nothing.
        unknown = {"id": "b-1", "messages": [user], "trigger": "regenerate-message", "messageId": "nope"}
        assert (await client.post("/v1/ai-sdk/chat", json=unknown)).status_code == 404
        fresh = {"id": "b-none", "messages": [user], "trigger": "regenerate-message"}
        assert (await client.post("/v1/ai-sdk/chat", json=fresh)).status_code == 404
        sessions = (await client.get("/v1/sessions")).json()["sessions"]
        assert [s["id"] for s in sessions] == [session_id]


PNG_2X1 = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAABCAIAAAB7QOjdAAAAD0lEQVR4nGP8z8DAwMAAAAYIAQHLR3Z1AAAAAElFTkSuQmCC"


async def test_a_file_part_is_an_attachment_the_model_receives_and_the_history_shows(
    server: LiveServer,
) -> None:
    """What `sendMessage({text, files})` posts: the data URL stored as a file of the caller, attached to the
    message (the demo model describes it), and the kit's history gives it back as a file part at Parley's
    content route."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        image = {
            "type": "file",
            "mediaType": "image/png",
            "filename": "dot.png",
            "url": f"data:image/png;base64,{PNG_2X1}",
        }
        user = {"id": "u-img", "role": "user", "parts": [image, {"type": "text", "text": "what is this?"}]}
        chunks = await post_chat(client, {"id": "f-1", "messages": [user], "trigger": "submit-message"})
        text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
        assert "image/png" in text and "2x1" in text.replace(" ", "").replace("×", "x"), text
        history = (await client.get("/v1/ai-sdk/chat/f-1/messages")).json()
        part = history[0]["parts"][0]
        assert part["type"] == "file" and part["mediaType"] == "image/png"
        content = await client.get(part["url"])
        assert content.status_code == 200 and content.content == base64.b64decode(PNG_2X1)


@pytest.mark.both_backends
async def test_an_edit_keeps_the_files_the_history_gave_back_and_takes_new_ones(server: LiveServer) -> None:
    """What `sendMessage(editedMessage, {messageId})` posts after a reload: the edited message's file parts as
    the history gave them (Parley's content route) with a new data URL beside them; the new turn's message
    carries both, and the demo model describes both."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        image = {"type": "file", "mediaType": "image/png", "url": f"data:image/png;base64,{PNG_2X1}"}
        user = {"id": "u-e", "role": "user", "parts": [image, {"type": "text", "text": "what is this?"}]}
        await post_chat(client, {"id": "e-1", "messages": [user], "trigger": "submit-message"})
        [kept, _] = (await client.get("/v1/ai-sdk/chat/e-1/messages")).json()[0]["parts"]
        assert kept["url"].startswith("/v1/files/f_")
        notes = {
            "type": "file",
            "mediaType": "text/plain",
            "url": "data:text/plain;base64," + base64.b64encode(b"some notes").decode(),
        }
        edited = {"id": "u-e", "role": "user", "parts": [kept, notes, {"type": "text", "text": "and now?"}]}
        chunks = await post_chat(
            client, {"id": "e-1", "messages": [edited], "trigger": "submit-message", "messageId": "u-e"}
        )
        text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
        assert "I received 2 files" in text and "text/plain, 10 bytes" in text, text
        history = (await client.get("/v1/ai-sdk/chat/e-1/messages")).json()
        assert [p["type"] for p in history[0]["parts"]] == ["file", "file", "text"]
        assert history[0]["parts"][0]["url"] == kept["url"]
        session_id = next(c for c in chunks if c["type"] == "data-parley-session")["data"]["sessionId"]
        turns = (await client.get(f"/v1/sessions/{session_id}/turns")).json()["turns"]
        assert len(turns) == 1 and len(turns[0]["siblings"]) == 2
        # Another principal's file, or one that does not exist, is a 404 that stores nothing.
        gone = {**kept, "url": "/v1/files/f_0000000000000000/content"}
        missing = {"id": "u-e", "role": "user", "parts": [gone, {"type": "text", "text": "?"}]}
        refused = await client.post(
            "/v1/ai-sdk/chat",
            json={"id": "e-1", "messages": [missing], "trigger": "submit-message", "messageId": "u-e"},
        )
        assert refused.status_code == 404, refused.text
