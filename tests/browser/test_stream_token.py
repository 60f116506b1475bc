"""A stream token in a real browser's `EventSource` (chromium against a real server process with a key): the
URL carries the short-lived token, never the key; the stream delivers the turn; a token of another session
is refused without the key ever being in the page. Frames are named by their type: one listener per type,
as docs/frontend.md shows."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.browser.conftest import KEY
from tests.support.process import ServerProcess

pytestmark = pytest.mark.slow

OPEN_JS = """url => {
  window.seen = [];
  window.failed = false;
  const source = new EventSource(url);
  for (const type of ['turn_start', 'user_message', 'text_delta', 'turn_done']) {
    source.addEventListener(type, (message) => window.seen.push(JSON.parse(message.data).type));
  }
  source.onerror = () => { if (source.readyState === EventSource.CLOSED) window.failed = true; };
  window.source = source;
}"""


def _poll(page: Any, script: str, *, timeout: float = 30.0) -> Any:
    """Polled from Python: a page with a strict CSP refuses wait_for_function's evaluation."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = page.evaluate(script)
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"never true: {script}")


def test_an_eventsource_opened_with_a_stream_token_streams_the_turn(
    browser: Any, parley: ServerProcess
) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=parley.base_url, headers=headers, timeout=30) as api:
        sid = api.post("/v1/sessions", json={}).json()["id"]
        other = api.post("/v1/sessions", json={}).json()["id"]
        token = api.post(f"/v1/sessions/{sid}/stream_token").json()["token"]
        assert KEY not in token

        page = browser.new_page()
        try:
            page.goto(f"{parley.base_url}/healthz")  # the server's origin, without the page or its key
            page.evaluate(OPEN_JS, f"/v1/sessions/{sid}/events?access_token={token}")
            _poll(page, "() => window.source.readyState === EventSource.OPEN")
            api.post(f"/v1/sessions/{sid}/messages", json={"content": "what time is it?"}).raise_for_status()
            _poll(page, "() => window.seen.includes('turn_done')")
            seen = page.evaluate("() => window.seen")
            assert seen.index("turn_start") < seen.index("text_delta") < seen.index("turn_done")
            page.evaluate("() => window.source.close()")

            # The same token for another session: refused (the browser gives up: a 4xx closes an EventSource).
            page.evaluate(OPEN_JS, f"/v1/sessions/{other}/events?access_token={token}")
            _poll(page, "() => window.failed")
            assert page.evaluate("() => window.seen") == []
        finally:
            page.close()
