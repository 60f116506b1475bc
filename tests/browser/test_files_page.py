"""Files on the reference page (/ui) in a real chromium against a real server process: an image chosen with
the Attach button and one pasted into the input are uploaded, sent with the message, shown as thumbnails in
the user bubble (their bytes fetched with the page's key), described by the demo model, and shown again
after a reload, from the history; a large upload shows its progress on its chip while it goes up."""

from __future__ import annotations

import base64
import random
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

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


PROGRESS_JS = """(() => [...document.querySelectorAll('#pending-files .attachment-chip.uploading')]
  .map(c => [Number(c.dataset.progress), c.querySelector('progress').value, c.textContent]))"""


def test_a_large_upload_shows_its_progress_on_the_chip_then_a_thumbnail(
    browser: Any, parley: ServerProcess, shots: Path, tmp_path: Path
) -> None:
    """XMLHttpRequest's upload progress on the chip while the file goes up (the upload throttled to 256 KB/s
    through the DevTools protocol, so that it lasts seconds), then the uploaded chip, then the thumbnail in
    the user bubble once sent."""
    page = open_page(browser, parley.base_url)
    sid = new_session(page)
    noise = Image.frombytes("RGB", (600, 600), random.Random(7).randbytes(600 * 600 * 3))
    big = tmp_path / "noise.png"
    noise.save(big, "PNG")  # noise does not compress: about 1 MB
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": 256 * 1024},
    )
    page.set_input_files("#file-input", str(big))
    # Read in the same poll that sees it: the chip as it is while part of the file has gone up.
    seen = page.wait_for_function(
        "() => { const [c] = " + PROGRESS_JS + "().filter(([p]) => p > 0 && p < 1); return c || false; }"
    ).json_value()
    progress, bar, text = seen
    assert 0 < progress < 1 and abs(bar - progress) < 0.01
    assert text.startswith("noise.png (uploading… ") and text.endswith("%)")
    page.screenshot(path=str(shots / "upload-progress.png"))
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    page.wait_for_selector("#pending-files [data-file-id]")
    assert page.evaluate(PROGRESS_JS) == []
    assert page.locator("#pending-files [data-progress]").count() == 0
    send(page, "what is this?")
    shown = settled(page, parley.base_url, sid)
    assert shown[1].startswith(
        f"assistant: I received 1 file: noise.png (image/png, {big.stat().st_size} bytes, 600x600 pixels)."
    )
    page.wait_for_function(
        "() => [...document.querySelectorAll('.message-row.user .thumbnail')]"
        ".some(i => i.naturalWidth === 600)"
    )
