"""The wire protocol's events (app.protocol.events): model text is made valid Unicode before it is sent."""

from __future__ import annotations

import pytest

from app.protocol.events import clean_text


@pytest.mark.parametrize(
    ("raw", "clean"),
    [("plain", "plain"), ("é😀", "é😀"), ("a\ud800b", "a\ufffdb"), ("\udfff", "\ufffd")],
)
def test_clean_text_replaces_lone_surrogates_only(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean
    clean_text(raw).encode()
