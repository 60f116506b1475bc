"""Writes ui/favicon.ico (16, 32 and 48 px) from ui/parley.svg, rendered by Debian's chromium through
Playwright's Python package (as tests/browser does): run it after changing the SVG, then `make ui`.

    .venv/bin/python clients/typescript/scripts/favicon.py

An ICO may hold PNG images as they are (every browser since IE 9 reads them), so this only packs the
renders behind the ICO directory."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from playwright.sync_api import sync_playwright

UI = Path(__file__).resolve().parents[1] / "ui"
SIZES = (16, 32, 48)
CHROMIUM = os.environ.get("PARLEY_CHROMIUM", "/usr/bin/chromium")


def render(svg: str) -> list[bytes]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        pngs = []
        for size in SIZES:
            page = browser.new_page(viewport={"width": size, "height": size})
            page.set_content(
                "<style>html,body{margin:0;background:transparent}svg{display:block}</style>"
                + svg.replace("<svg ", f'<svg width="{size}" height="{size}" ', 1)
            )
            pngs.append(page.screenshot(omit_background=True))
            page.close()
        browser.close()
    return pngs


def ico(pngs: list[bytes]) -> bytes:
    header = struct.pack("<HHH", 0, 1, len(pngs))
    offset = len(header) + 16 * len(pngs)
    entries = b""
    for size, png in zip(SIZES, pngs, strict=True):
        entries += struct.pack("<BBBBHHII", size % 256, size % 256, 0, 0, 1, 32, len(png), offset)
        offset += len(png)
    return header + entries + b"".join(pngs)


if __name__ == "__main__":
    (UI / "favicon.ico").write_bytes(ico(render((UI / "parley.svg").read_text())))
    print(f"wrote {UI / 'favicon.ico'}")
