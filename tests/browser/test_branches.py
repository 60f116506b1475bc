"""Branches on the reference page (/ui) in a real chromium against a real server process: regenerate the
last answer, switch back with the "< i/n >" arrows, edit the question; after each step the page shows
exactly the active path the server holds (GET .../messages), and the position label follows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.page import new_session, open_page, send, settled
from tests.support.process import ServerProcess

pytestmark = pytest.mark.slow


def test_regenerate_switch_with_the_arrows_and_edit(browser: Any, parley: ServerProcess, shots: Path) -> None:
    page = open_page(browser, parley.base_url)
    sid = new_session(page)
    send(page, "hello there")
    first = settled(page, parley.base_url, sid)
    assert first[0] == "user: hello there" and len(first) == 2
    assert page.locator(".branch-position").count() == 0  # one version: no arrows

    page.click("button.branch-regenerate")
    page.wait_for_selector(".branch-position:text('2/2')")
    regenerated = settled(page, parley.base_url, sid)
    assert regenerated[0] == "user: hello there" and len(regenerated) == 2

    page.click("button.branch-previous")
    page.wait_for_selector(".branch-position:text('1/2')")
    assert settled(page, parley.base_url, sid) == first
    assert page.is_disabled("button.branch-previous") and page.is_enabled("button.branch-next")

    page.once("dialog", lambda dialog: dialog.accept("hello again, edited"))
    page.click("button.branch-edit")
    page.wait_for_selector(".branch-position:text('3/3')")
    edited = settled(page, parley.base_url, sid)
    assert edited[0] == "user: hello again, edited" and len(edited) == 2
    page.screenshot(path=str(shots / "branches.png"))

    page.click("button.branch-previous")
    page.wait_for_selector(".branch-position:text('2/3')")
    assert settled(page, parley.base_url, sid) == regenerated
