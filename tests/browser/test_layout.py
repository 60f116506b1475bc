"""The reference page at a phone's width (390 px) and a desktop's (1280 px), measured in the DOM: the sidebar
is a drawer on the phone, the message box and Stop fit, nothing overflows sideways, sessions are listed by
what a person recognises, an approval card leaves the newest message in view, and a server with keys says
what to do first. Screenshots go to the test's tmp directory (the README shows only those of test_page)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import KEY
from tests.browser.page import new_session, open_menu, open_page, send, settled
from tests.support.process import ServerProcess

pytestmark = pytest.mark.slow

PHONE = (390, 844)
DESKTOP = (1280, 800)

BOX_JS = """sel => { const e = document.querySelector(sel); if (!e) return null;
  const r = e.getBoundingClientRect();
  return {left: r.left, top: r.top, right: r.right, bottom: r.bottom, width: r.width, height: r.height}; }"""

# What sticks out of the viewport sideways: the document's scroll width, and every element of the chat whose
# box leaves the viewport (an ellipsis inside a box is fine, a box wider than the screen is not).
OVERFLOW_JS = """() => {
  const width = document.documentElement.clientWidth;
  const out = [...document.querySelectorAll('#chat *')].filter(e => {
    const r = e.getBoundingClientRect();
    return r.width > 0 && (r.right > width + 0.5 || r.left < -0.5);
  }).map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.className} right=${e.getBoundingClientRect().right}`);
  return {width, scroll: document.documentElement.scrollWidth, body: document.body.scrollWidth, out};
}"""

# The newest rendered message and what covers the conversation's bottom edge, once an approval card shows.
NEWEST_JS = """() => {
  const rows = [...document.querySelectorAll('#messages .message-row')];
  const card = document.querySelector('.approval-card');
  if (!rows.length || !card) return null;
  const r = rows[rows.length - 1].getBoundingClientRect();
  const box = document.querySelector('#messages').getBoundingClientRect();
  const c = card.getBoundingClientRect();
  const last = rows[rows.length - 1];
  return {kind: last.dataset.kind, text: last.textContent, top: r.top, bottom: r.bottom,
    boxTop: box.top, boxBottom: box.bottom, cardTop: c.top, cardBottom: c.bottom};
}"""


def newest(page: Any) -> Any:
    return page.evaluate(NEWEST_JS)


def box(page: Any, selector: str) -> dict[str, float]:
    found = page.evaluate(BOX_JS, selector)
    assert found is not None, selector
    return dict(found)


def until(page: Any, check: Any, what: str, timeout: float = 30.0, shown: Any = None) -> Any:
    """Polls `check(page)` from Python until it is truthy (the page's strict CSP refuses the function
    Playwright's wait_for_function would evaluate in it); a failure shows `shown(page)`, or the last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check(page)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what} (last: {(shown or check)(page)!r})")


def assert_fits(page: Any) -> None:
    measured = page.evaluate(OVERFLOW_JS)
    assert measured["scroll"] <= measured["width"] and measured["body"] <= measured["width"], measured
    assert measured["out"] == [], measured


def drawer_open(page: Any) -> bool:
    sidebar = box(page, "#sidebar")
    return page.is_visible("#sidebar") and sidebar["left"] >= 0 and sidebar["right"] <= PHONE[0]


def drawer_closed(page: Any) -> bool:
    return page.is_hidden("#sidebar") and box(page, "#sidebar")["right"] <= 0


def test_on_a_phone_the_sidebar_is_a_drawer_and_the_conversation_has_the_width(
    browser: Any, parley: ServerProcess, tmp_path: Path
) -> None:
    page = open_page(browser, parley.base_url, viewport=PHONE)
    until(page, lambda p: p.query_selector("#model option"), "the models loaded")
    # collapsed: the conversation has the whole width, ☰ opens the sidebar over it, ✕ closes it
    until(page, drawer_closed, "the drawer is closed")
    assert box(page, "#chat")["width"] == PHONE[0]
    assert page.is_visible("#menu") and page.get_attribute("#menu", "aria-expanded") == "false"
    page.click("#menu")
    until(page, drawer_open, "the drawer opened")
    assert page.get_attribute("#menu", "aria-expanded") == "true" and page.is_visible("#new-session")
    page.screenshot(path=str(tmp_path / "phone-menu.png"))
    page.click("#close-menu")
    until(page, drawer_closed, "the drawer closed")

    sid = new_session(page)  # opens the drawer, clicks New session: the drawer closes on the new session
    until(page, drawer_closed, "the drawer closed on the new session")
    first = "[long] [slow] a story about a lighthouse keeper who collects sea glass"
    send(page, first)
    until(page, lambda p: p.is_visible("#stop"), "Stop shows while the answer streams")
    until(
        page,
        lambda p: len(p.inner_text(".message-row[data-kind=assistant] .message-bubble") or "") > 80,
        "the answer streams",
    )
    message_box, stop, send_button = box(page, "#input"), box(page, "#stop"), box(page, "#send")
    assert message_box["width"] >= 290, message_box
    for button in (stop, send_button):
        assert button["left"] >= 0 and button["right"] <= PHONE[0], button
        assert button["top"] >= 0 and button["bottom"] <= PHONE[1], button
    # the user's message wraps at words, not one letter per line
    assert box(page, ".message-row[data-kind=user] .message-bubble")["width"] >= 250
    assert_fits(page)
    page.screenshot(path=str(tmp_path / "phone-streaming.png"))
    page.click("#stop")
    settled(page, parley.base_url, sid)
    assert_fits(page)

    # the session is named by its first message, in the header and in the list; its id is not shown
    assert page.inner_text("#session-title") == first
    open_menu(page)
    until(page, drawer_open, "the drawer opened")
    listed = page.locator(f"#sessions li[data-id='{sid}']")
    assert listed.locator(".session-name").inner_text() == first
    assert sid not in listed.inner_text()
    assert box(page, f"#sessions li[data-id='{sid}']")["right"] <= box(page, "#sidebar")["right"]
    page.screenshot(path=str(tmp_path / "phone-sessions.png"))
    listed.click()  # choosing a session closes the drawer
    until(page, drawer_closed, "the drawer closed on a chosen session")
    page.screenshot(path=str(tmp_path / "phone-chat.png"))


def test_on_a_desktop_the_sidebar_stays_and_lists_sessions_by_title_or_first_message(
    browser: Any, parley: ServerProcess, tmp_path: Path
) -> None:
    # sessions made elsewhere: one titled, one named by its first message only, one still empty
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=parley.base_url, headers=headers, timeout=60) as api:
        titled = api.post("/v1/sessions", json={"title": "Quarterly report"}).json()["id"]
        untitled = api.post("/v1/sessions", json={}).json()["id"]
        said = api.post(
            f"/v1/sessions/{untitled}/messages",
            params={"wait": "true"},
            json={"content": "plan a picnic for saturday\nwith sandwiches"},
        )
        assert said.status_code in (200, 201, 202), said.text
        empty = api.post("/v1/sessions", json={}).json()["id"]

    page = open_page(browser, parley.base_url, viewport=DESKTOP)
    assert page.is_hidden("#menu")
    until(page, lambda p: p.query_selector(f"#sessions li[data-id='{empty}']"), "the sessions are listed")
    sidebar = box(page, "#sidebar")
    assert page.is_visible("#sidebar") and (sidebar["left"], sidebar["width"]) == (0, 260)

    def name(session_id: str) -> str:
        return str(page.inner_text(f"#sessions li[data-id='{session_id}'] .session-name"))

    until(page, lambda p: name(untitled) == "plan a picnic for saturday", "the first message names it")
    assert name(titled) == "Quarterly report" and name(empty) == "New session"
    for session_id in (titled, untitled, empty):  # then the time and the model, never the raw id
        text = page.inner_text(f"#sessions li[data-id='{session_id}']")
        assert session_id not in text and "parley/demo" in text

    sid = new_session(page)
    send(page, "what time is it?")
    settled(page, parley.base_url, sid)
    assert box(page, "#input")["width"] >= 600
    assert box(page, "#chat")["left"] == 260
    assert page.inner_text("#session-title") == "what time is it?"
    until(page, lambda p: name(sid) == "what time is it?", "the new session is named by its message")
    assert_fits(page)
    page.screenshot(path=str(tmp_path / "desktop-chat.png"))


@pytest.mark.parametrize("viewport", [PHONE, (1280, 640)], ids=["phone", "desktop"])
def test_an_approval_card_leaves_the_newest_message_in_view(
    browser: Any, parley: ServerProcess, tmp_path: Path, viewport: tuple[int, int]
) -> None:
    page = open_page(browser, parley.base_url, viewport=viewport)
    open_menu(page)
    page.check("#ask-approval")
    sid = new_session(page)
    send(page, "[long] a story long enough to scroll")  # no tool: no card yet, the box is scrolled
    settled(page, parley.base_url, sid)
    send(page, "what is 2+3*4?")
    page.locator(".approval-card").wait_for()

    def newest_in_view(p: Any) -> Any:
        seen = newest(p)
        if seen is None or seen["kind"] != "tool_group":  # the call the card asks about is the newest row
            return None
        visible = seen["top"] >= seen["boxTop"] - 1 and seen["bottom"] <= seen["boxBottom"] + 1
        return seen if visible and seen["cardTop"] >= seen["bottom"] else None

    until(page, newest_in_view, "the newest message is in view above the card", timeout=10, shown=newest)
    assert page.inner_text(".message-row[data-kind=tool_group] summary").startswith("⚙ calculate")
    card = box(page, ".approval-card")
    assert card["bottom"] <= viewport[1] and card["right"] <= viewport[0]
    assert_fits(page)
    page.screenshot(path=str(tmp_path / f"approval-{viewport[0]}.png"))
    # a long reason, one unbroken word, makes the tool group's line long: it wraps inside the screen
    page.locator(".approval-card .approval-reason").fill("not-with-these-numbers-" * 12)
    page.locator(".approval-card button.reject").click()
    settled(page, parley.base_url, sid)
    summary = page.inner_text(".message-row[data-kind=tool_group] summary")
    assert "rejected: not-with-these-numbers-" in summary
    assert_fits(page)
    page.screenshot(path=str(tmp_path / f"rejected-{viewport[0]}.png"))


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_with_keys_the_first_screen_says_to_enter_one(
    browser: Any, parley: ServerProcess, tmp_path: Path, viewport: tuple[int, int]
) -> None:
    page = open_page(browser, parley.base_url, key=None, viewport=viewport)
    error = page.locator("#error")
    error.wait_for()
    text = error.inner_text()
    assert text.startswith("This server needs an API key. Enter yours in the API key field"), text
    assert "`" not in text and "`" not in page.inner_text("#chat")
    assert box(page, "#error")["right"] <= viewport[0]
    assert_fits(page)
    page.screenshot(path=str(tmp_path / f"keys-{viewport[0]}.png"))
    # the tab's icon needs no key either
    icon = httpx.get(f"{parley.base_url}/favicon.ico", timeout=30)
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/")
    # the field it names is where it says: in the sidebar, behind ☰ on a phone
    open_menu(page)
    page.fill("#key", KEY)
    page.press("#key", "Tab")
    until(page, lambda p: p.is_hidden("#error") and p.query_selector("#model option"), "the key was taken")
