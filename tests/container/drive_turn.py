"""Drives one whole demo turn against the container at CONTAINER_URL, over HTTP and SSE, as a client.

Run by test_container.py through shared/tools/container-smoke.sh (which builds and starts the image with
PARLEY_API_KEYS=smoke:$PARLEY_SMOKE_KEY):
    python -m tests.container.drive_turn
Exits non-zero, with the reason, when anything differs from what a client of the service relies on.
"""

from __future__ import annotations

import asyncio
import os
import time

import httpx
from pydantic import TypeAdapter

from app.protocol.events import Event
from tests.support.sse import EventReader

EVENTS: TypeAdapter[Event] = TypeAdapter(Event)


async def _ready(client: httpx.AsyncClient, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (await client.get("/readyz")).status_code != 200:
        assert time.monotonic() < deadline, "/readyz did not answer 200"
        await asyncio.sleep(0.25)


async def drive(base_url: str, key: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        await _ready(client)
        # The page and the docs ship in the image, with their assets (no CDN, no Node in the image).
        for path in ("/ui", "/ui/assets/parley.js", "/docs", "/docs/assets/swagger-ui-bundle.js"):
            shipped = await client.get(path)
            assert shipped.status_code == 200 and shipped.content, path
        anonymous = await client.post("/v1/sessions", json={"title": "container"})
        assert anonymous.status_code == 401, anonymous.text
        assert anonymous.headers["www-authenticate"] == "Bearer"
        client.headers["Authorization"] = f"Bearer {key}"
        created = await client.post("/v1/sessions", json={"title": "container"})
        assert created.status_code == 201, created.text
        session = created.json()
        sid = session["id"]
        assert session["model"] == "parley/demo", session

        # As EventSource does: the key in the URL, no Authorization header.
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=30) as browser,
            EventReader(browser, f"/v1/sessions/{sid}/events?access_token={key}") as reader,
        ):
            posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "what time is it?"})
            assert posted.status_code == 202, posted.text
            await reader.wait_type("turn_done", timeout=60)

        for frame in reader.events:
            event = EVENTS.validate_python(frame.data)
            assert (event.type, str(event.seq), event.session_id) == (frame.event, frame.id, sid), frame
        types = {frame.event for frame in reader.events}
        expected = {
            "turn_start",
            "user_message",
            "agent_status",
            "text_delta",
            "response_done",
            "token_usage",
        }
        expected |= {"tool_exec_start", "tool_exec_end", "turn_done"}
        assert expected <= types, f"missing events: {expected - types}"
        done = reader.of_type("turn_done")[0]
        assert done["status"] == "completed" and done["turn_id"] == posted.json()["turn_id"], done
        assert reader.of_type("tool_exec_start")[0]["tool_call"]["name"] == "current_time"

        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        kinds = [(m["type"], m.get("role")) for m in history]
        assert kinds == [
            ("turn_start", None),
            ("text", "user"),
            ("text", "assistant"),
            ("tool_group", "assistant"),
            ("text", "assistant"),
            ("turn_done", None),
        ], kinds
        answer = history[4]
        streamed = "".join(d["text"] for d in reader.of_type("text_delta") if d["id"] == answer["id"])
        assert answer["content"] == streamed != "", (answer, streamed)
        print(f"drive_turn: {len(reader.events)} events, answer {answer['content']!r}")


if __name__ == "__main__":
    asyncio.run(drive(os.environ["CONTAINER_URL"], os.environ["PARLEY_SMOKE_KEY"]))
