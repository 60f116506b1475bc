"""What the browser tests do on the page and read from it, in one place."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.browser.conftest import KEY

# The rendered conversation: user and assistant bubbles in order, as the page shows them (without the
# interrupted mark, and without messages still waiting or not yet confirmed).
TRANSCRIPT_JS = """() => [...document.querySelectorAll('#messages .message-row')]
  .filter(r => (r.dataset.kind === 'user' || r.dataset.kind === 'assistant')
    && !r.classList.contains('queued') && !r.classList.contains('optimistic'))
  .map(r => {
    const b = r.querySelector('.message-bubble').cloneNode(true);
    b.querySelectorAll('.interrupted-mark').forEach(m => m.remove());
    return r.dataset.kind + ': ' + b.textContent;
  })"""


def open_page(
    browser: Any,
    base_url: str,
    key: str | None = KEY,
    session_id: str | None = None,
    viewport: tuple[int, int] = (1100, 760),
) -> Any:
    """A new tab on /ui with the key entered (the page keeps it in sessionStorage, per tab); `key=None`
    enters none. The key field is set by script: on a narrow viewport it is in the closed drawer."""
    width, height = viewport
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.on("pageerror", lambda error: print(f"page error: {error}"))
    page.goto(f"{base_url}/ui")
    if key is not None:
        page.evaluate("key => { document.querySelector('#key').value = key }", key)
        page.dispatch_event("#key", "change")
    if session_id is not None:
        page.evaluate("id => { location.hash = id }", session_id)
        page.wait_for_selector("#connection[data-status='open']")
    return page


def new_session(page: Any) -> str:
    page.wait_for_selector("#model option", state="attached")
    open_menu(page)
    page.click("#new-session")
    page.wait_for_selector("#connection[data-status='open']")
    return str(page.evaluate("() => location.hash.slice(1)"))


def open_menu(page: Any) -> None:
    """On a narrow viewport the sidebar is a drawer: ☰ opens it (no-op where the sidebar is always shown)."""
    if page.is_visible("#menu") and page.get_attribute("#menu", "aria-expanded") != "true":
        page.click("#menu")


def send(page: Any, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def session_idle(base_url: str, session_id: str) -> bool:
    response = httpx.get(
        f"{base_url}/v1/sessions/{session_id}", headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    )
    return response.status_code == 200 and response.json()["running_turn_id"] is None


def settled(page: Any, base_url: str, session_id: str, timeout: float = 60.0) -> list[str]:
    """Waits until the turn has ended and the page shows exactly what the history holds; returns it.
    A page that doubled or lost text never gets there, and the assertion shows both sides."""
    deadline = time.monotonic() + timeout
    shown: list[str] = []
    stored: list[str] = []
    while time.monotonic() < deadline:
        if session_idle(base_url, session_id):
            stored = history_transcript(base_url, session_id)
            shown = transcript(page)
            if shown == stored and page.is_hidden("#status-line"):
                return shown
        time.sleep(0.2)
    raise AssertionError(f"the page never matched the history:\npage:    {shown}\nhistory: {stored}")


def transcript(page: Any) -> list[str]:
    return list(page.evaluate(TRANSCRIPT_JS))


def history_transcript(base_url: str, session_id: str) -> list[str]:
    response = httpx.get(
        f"{base_url}/v1/sessions/{session_id}/messages",
        params={"limit": 1000},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    rows = response.json()["chat_messages"]
    return [
        f"{row['role']}: {row['content']}"
        for row in rows
        if row["type"] == "text" and row["role"] in ("user", "assistant")
    ]


def history_rows(base_url: str, session_id: str, kind: str) -> list[dict[str, Any]]:
    """The session's stored chat_messages of one type (e.g. tool_group), in order."""
    response = httpx.get(
        f"{base_url}/v1/sessions/{session_id}/messages",
        params={"limit": 1000},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    return [row for row in response.json()["chat_messages"] if row["type"] == kind]


def pending(base_url: str, session_id: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{base_url}/v1/sessions/{session_id}/pending", headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    )
    return list(response.json()["pending"])


def posts_to(page: Any, path_end: str) -> list[Any]:
    """Every POST the page sends to a URL ending in `path_end`, from now on (the list fills as they go)."""
    seen: list[Any] = []
    page.on("request", lambda r: seen.append(r) if r.method == "POST" and r.url.endswith(path_end) else None)
    return seen
