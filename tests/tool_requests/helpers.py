"""What the client tool and approval tests share: the tool declarations, answering, and the checks of
the history the strict upstream saw."""

from __future__ import annotations

from typing import Any

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import Session, assert_strictly_valid, chat_requests

LOCATION = {
    "name": "get_location",
    "description": "The user's location, from the browser.",
    "parameters": {"type": "object", "properties": {"precise": {"type": "boolean"}}},
}


def calls(*specs: tuple[str, str, str], text: str | None = None) -> Script:
    return Script.tool_calls(list(specs), text_before=text)


async def answer(session: Session, route: str, **body: Any) -> tuple[int, dict[str, Any]]:
    response = await session.client.post(f"{session.base}/{route}", json=body)
    data: dict[str, Any] = response.json()
    return response.status_code, data


async def pending(session: Session) -> list[dict[str, Any]]:
    response = await session.client.get(f"{session.base}/pending")
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["pending"]
    return items


async def awaiting(session: Session, event: str, count: int = 1) -> list[dict[str, Any]]:
    """The `event` requests once `count` came and the session says it awaits input. A bound, not a
    timing: the first model call of a test process waits for the model layer to load (seconds)."""
    found = await session.wait_type(event, count=count, timeout=30.0)
    await session.reader.wait_for(
        lambda e: e.event == "agent_status" and e.data["status"] == "awaiting_input", timeout=10.0
    )
    return [e.data for e in found]


def tool_messages(upstream: FakeUpstream, request_number: int) -> list[dict[str, Any]]:
    """The tool results the n-th (1-based) model request carried."""
    body = chat_requests(upstream)[request_number - 1].body
    return [m for m in body["messages"] if m["role"] == "tool"]


async def next_turn_is_valid(session: Session, upstream: FakeUpstream) -> None:
    """A further message gets a completed turn, and every history the upstream saw was strictly valid."""
    upstream.enqueue(Script.text("Anything else?"))
    posted = await session.accepted("thanks")
    done = await session.turn_done(posted["turn_id"])
    assert done["status"] == "completed"
    assert_strictly_valid(upstream)


def tool_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in history if m["type"] == "tool_group"]
