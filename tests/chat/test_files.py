"""app.chat.files' pure parts: a file's type from its bytes (magic numbers; text only as UTF-8 without NUL
that its name or declared type calls text), and a safe name."""

from __future__ import annotations

import pytest

from app.chat.files import clean_name, sniff


@pytest.mark.parametrize(
    ("head", "name", "declared", "text", "expected"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "x.txt", "text/plain", False, "image/png"),
        (b"\xff\xd8\xff\xe0", "x", None, False, "image/jpeg"),
        (b"GIF89a", "x.gif", None, False, "image/gif"),
        (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "x", None, False, "image/webp"),
        (b"RIFF\x10\x00\x00\x00WAVEfmt ", "x.webp", "image/webp", False, None),
        (b"%PDF-1.7", "x", None, False, "application/pdf"),
        (b"\x7fELF\x02\x01", "x.png", "image/png", False, None),
        (b"hello", "x.png", "image/png", True, None),  # text, but nothing calls it text
        (b"hello", "notes.MD", None, True, "text/markdown"),
        (b"a,b", "t.csv", "application/octet-stream", True, "text/csv"),
        (b"{}", "blob", "application/json; charset=utf-8", True, "application/json"),
        (b"<html>", "x.html", "text/html", True, None),
        (b"hello", "x.txt", None, False, None),  # not UTF-8 (or with NUL) further on
    ],
)
def test_the_type_comes_from_the_bytes(
    head: bytes, name: str, declared: str | None, text: bool, expected: str | None
) -> None:
    assert sniff(head, name, declared, text=text) == expected


@pytest.mark.parametrize(
    ("given", "media_type", "expected"),
    [
        ("../../etc/passwd", None, "passwd"),
        ("C:\\Users\\me\\shot.png", None, "shot.png"),
        ("bad\x00\r\nname.txt", None, "badname.txt"),
        ("", "image/png", "attachment.png"),
        (None, "application/pdf", "attachment.pdf"),
        ("x" * 300, None, "x" * 255),
    ],
)
def test_a_name_keeps_no_directory_nor_control_character(
    given: str | None, media_type: str | None, expected: str
) -> None:
    assert clean_name(given, media_type) == expected
