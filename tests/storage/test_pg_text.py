"""app.storage.pg_text: the reversible mapping that lets PostgreSQL hold U+0000 and the JSON escape
`\\u0000` (docs/deployment.md, "Text PostgreSQL cannot hold"), on its own and on a real connection."""

from __future__ import annotations

import json

import psycopg
from hypothesis import given
from hypothesis import strategies as st

from app.storage import pg_text
from tests.support.postgres import ADMIN_URL, require_postgres

# The three mapped sequences, each alone, beside each other, and after runs of backslashes.
ODD = [
    "\x00",
    "\ufdd0",
    "\\u0000",
    "\\\\u0000",
    "\\\\\\u0000",
    "\ufdd00",
    "\ufdd0u",
    "\ufdd0\ufdd0",
    "a\x00\\u0000b",
]
# Text built from the characters the mapping looks at, so the generator meets them often.
TRICKY = st.text(alphabet=st.sampled_from(["\x00", "\ufdd0", "\\", "u", "0", "a", '"']), max_size=40)


def test_each_odd_sequence_is_stored_without_nul_or_escape_and_restored() -> None:
    for text in ODD:
        stored = pg_text.to_store(text)
        assert "\x00" not in stored
        assert pg_text.from_store(stored) == text


def test_plain_text_is_left_as_it_is() -> None:
    assert pg_text.to_store("plain \\n text") == "plain \\n text"
    assert pg_text.from_store("plain") == "plain"


@given(TRICKY)
def test_the_mapping_is_reversible_for_any_text(text: str) -> None:
    stored = pg_text.to_store(text)
    assert "\x00" not in stored
    assert pg_text.from_store(stored) == text


@given(st.recursive(st.none() | TRICKY, lambda inner: st.lists(inner) | st.dictionaries(TRICKY, inner)))
def test_json_keeps_any_value_and_holds_no_nul_escape(value: object) -> None:
    """What a JSON column stores parses in PostgreSQL's JSON functions (no `\\u0000` escape anywhere)."""
    stored = pg_text.dumps_json(value)
    assert "\\u0000" not in stored.replace("\\\\", "")
    assert json.loads(pg_text.restored_json(stored)) == value


def test_a_postgresql_connection_stores_and_reads_back_every_odd_text() -> None:
    require_postgres()
    with psycopg.connect(ADMIN_URL.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as c:
        pg_text.install(c)
        c.execute("CREATE TEMP TABLE odd (t text, v varchar(80), j text)")
        for text in ODD:
            c.execute("INSERT INTO odd VALUES (%s, %s, %s)", (text, text, json.dumps({"id": text})))
            c.execute("INSERT INTO odd VALUES (%b, %b, NULL)", (text, text))
        rows = c.execute("SELECT t, v FROM odd").fetchall()
        assert rows == [(text, text) for text in ODD for _ in range(2)]
        # PostgreSQL's JSON functions read what was stored: the escape never reaches them.
        ids = c.execute("SELECT CAST(j AS json) ->> 'id' FROM odd WHERE j IS NOT NULL").fetchall()
        assert len(ids) == len(ODD)
