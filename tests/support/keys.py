"""A key of every character an API key may have, and the test that no log shows a piece of one.

The rule is written out here rather than taken from app/chat/auth.py, so that the tests state it: printable
ASCII but the space, the comma (it separates PARLEY_API_KEYS' entries) and the four characters a URL's
query string reads as something else (`&` ends a value, `#` the query, `+` is a space, `%` an escape).
"""

from __future__ import annotations

from urllib.parse import unquote

QUERY_UNSAFE = "&#+%"
ALLOWED = "".join(c for c in map(chr, range(0x21, 0x7F)) if c != "," and c not in QUERY_UNSAFE)
PIECE = 6


def _every_character_key() -> str:
    # Two or three letters or digits, then a mark: any 6 characters of the key hold a mark, so no piece of
    # it is a word or a number that a log line could hold by chance.
    marks = [c for c in ALLOWED if not c.isalnum()]
    plain = [c for c in ALLOWED if c.isalnum()]
    bounds = [round(i * len(plain) / len(marks)) for i in range(len(marks) + 1)]
    starts, ends = bounds[:-1], bounds[1:]
    return "".join("".join(plain[a:b]) + mark for a, b, mark in zip(starts, ends, marks, strict=True))


EVERY_CHARACTER_KEY = _every_character_key()


def key_pieces_in(text: str, key: str) -> list[str]:
    """Every piece of `key` (PIECE characters or more) that `text` shows, as is or once percent-decoded."""
    seen = text + "\n" + unquote(text)
    return sorted({key[i : i + PIECE] for i in range(len(key) - PIECE + 1)} & _pieces_of(seen))


def _pieces_of(text: str) -> set[str]:
    return {text[i : i + PIECE] for i in range(len(text) - PIECE + 1)}
