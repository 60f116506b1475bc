"""Text PostgreSQL cannot hold, stored faithfully anyway.

PostgreSQL's `text` refuses the character U+0000, and its JSON functions (`->>`, a cast to `jsonb`) refuse
the escape `\\u0000` anywhere in the document they parse; SQLite keeps both. What Parley stores comes from
outside (a model's text, a tool's output, a request's fields), so on PostgreSQL every string crosses one
reversible mapping at the driver, in both directions, and nothing else in the code knows about it:

    U+FDD0 -> U+FDD0 U+FDD0     (the escape character itself, a Unicode noncharacter)
    U+0000 -> U+FDD0 "0"
    \\u0000 -> U+FDD0 "u"        (the JSON escape, where it is one: after an even run of backslashes)

Every U+FDD0 of a stored string is the first of such a pair, so reading maps it back exactly. The mapping
is installed on each PostgreSQL connection through psycopg's public adapters API (a dumper for `str`,
loaders for `text` and `varchar`) and on the engine's JSON (de)serializers; SQLite needs none of it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from psycopg.adapt import Buffer
from psycopg.types.string import StrBinaryDumper, StrDumperUnknown, TextBinaryLoader, TextLoader

ESCAPE = "\ufdd0"
_TO_STORE = re.compile(r"\ufdd0|\x00|(?<!\\)((?:\\\\)*)\\u0000")
_FROM_STORE = re.compile(r"\ufdd0(.)", re.DOTALL)
_RESTORED = {ESCAPE: ESCAPE, "0": "\x00", "u": "\\u0000"}


def _stored(match: re.Match[str]) -> str:
    found = match.group(0)
    if found == ESCAPE:
        return ESCAPE + ESCAPE
    if found == "\x00":
        return ESCAPE + "0"
    return (match.group(1) or "") + ESCAPE + "u"


def _restored(match: re.Match[str]) -> str:
    return _RESTORED.get(match.group(1), match.group(0))


def to_store(text: str) -> str:
    """`text` as PostgreSQL can hold it (unchanged when it holds none of the three)."""
    if _TO_STORE.search(text) is None:
        return text
    return _TO_STORE.sub(_stored, text)


def from_store(text: str) -> str:
    """What `to_store` was given."""
    if ESCAPE not in text:
        return text
    return _FROM_STORE.sub(_restored, text)


class _EscapingStrDumper(StrDumperUnknown):
    def dump(self, obj: str) -> Buffer | None:
        return super().dump(to_store(obj))


class _EscapingStrBinaryDumper(StrBinaryDumper):
    def dump(self, obj: str) -> Buffer | None:
        return super().dump(to_store(obj))


class _RestoringTextLoader(TextLoader):
    def load(self, data: Buffer) -> Any:
        loaded = super().load(data)
        return from_store(loaded) if isinstance(loaded, str) else loaded


class _RestoringTextBinaryLoader(TextBinaryLoader):
    def load(self, data: Buffer) -> Any:
        loaded = super().load(data)
        return from_store(loaded) if isinstance(loaded, str) else loaded


def install(connection: Any) -> None:
    """Puts the mapping on one psycopg connection (its own adapters: other connections are untouched)."""
    adapters = connection.adapters
    # The binary one first: the last registered serves `%s` (psycopg's own order, text as `unknown`).
    adapters.register_dumper(str, _EscapingStrBinaryDumper)
    adapters.register_dumper(str, _EscapingStrDumper)
    for name in ("text", "varchar"):
        adapters.register_loader(name, _RestoringTextLoader)
        adapters.register_loader(name, _RestoringTextBinaryLoader)


def dumps_json(value: Any) -> str:
    """A JSON column's serializer for PostgreSQL: json.dumps, then the mapping. A module function, not a
    closure: psycopg keeps a dumper per function it is given."""
    return to_store(json.dumps(value))


def restored_json(stored: str | bytes) -> str:
    """A JSON column's stored text with the mapping undone, for its deserializer."""
    return from_store(stored.decode() if isinstance(stored, bytes) else stored)
