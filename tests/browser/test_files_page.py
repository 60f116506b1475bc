"""Files on the reference page (/ui) in a real chromium against a real server process: an image chosen with
the Attach button and one pasted into the input are uploaded, sent with the message, shown as thumbnails in
the user bubble (their bytes fetched with the page's key), described by the demo model, and shown again
after a reload, from the history."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from tests.browser.page import new_session, open_page, send, settled
from tests.support.process import ServerProcess

pytestmark = pytest.mark.slow

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAABCAIAAAB7QOjdAAAAD0lEQVR4nGP8z8DAwMAAAAYIAQHLR3Z1AAAAAElFTkSuQmCC"
)
PASTE_JS = """bytes => {
  const data = new DataTransfer();
  data.items.add(new File([new Uint8Array(bytes)], 'pasted.png', { type: 'image/png' }));
  document.querySelector('#input').dispatchEvent(
    new ClipboardEvent('paste', { clipboardData: data, bubbles: true, cancelable: true }));
}"""
LOADED_JS = """() => [...document.querySelectorAll('.message-row.user .thumbnail')]
  .map(i => [i.alt, i.complete && i.naturalWidth, i.naturalHeight])"""


def test_an_attached_and_a_pasted_image_show_as_thumbnails_and_the_model_describes_them(
    browser: Any, parley: ServerProcess, shots: Path, tmp_path: Path
) -> None:
    page = open_page(browser, parley.base_url)
    sid = new_session(page)
    chosen = tmp_path / "chosen.png"
    chosen.write_bytes(PNG)
    page.set_input_files("#file-input", str(chosen))
    page.evaluate(PASTE_JS, list(PNG + b"pasted"))  # other bytes: another file
    page.wait_for_function("() => document.querySelectorAll('#pending-files [data-file-id]').length === 2")
    send(page, "what are these?")
    shown = settled(page, parley.base_url, sid)
    assert shown[0] == "user: what are these?"
    assert shown[1].startswith(
        f"assistant: I received 2 files: chosen.png (image/png, {len(PNG)} bytes, 2x1 pixels); "
        f"pasted.png (image/png, {len(PNG) + 6} bytes, 2x1 pixels)."
    )
    assert page.locator("#pending-files [data-file-id]").count() == 0
    page.wait_for_function(
        "() => [...document.querySelectorAll('.thumbnail')].every(i => i.naturalWidth === 2)"
    )
    assert page.evaluate(LOADED_JS) == [["chosen.png", 2, 1], ["pasted.png", 2, 1]]
    page.screenshot(path=str(shots / "attachments.png"))

    page.reload()
    page.evaluate("id => { location.hash = id }", sid)
    page.wait_for_selector("#connection[data-status='open']")
    page.wait_for_function("() => document.querySelectorAll('.thumbnail').length === 2")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.thumbnail')].every(i => i.naturalWidth === 2)"
    )
    assert page.evaluate(LOADED_JS) == [["chosen.png", 2, 1], ["pasted.png", 2, 1]]
