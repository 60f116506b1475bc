"""The PostgreSQL test fixture's own rules (tests/support/postgres.py): an unreachable server is a skip with
one line saying how to enable the tests, and under CI=true a failure, so CI never passes without them."""

from __future__ import annotations

import pytest

from tests.support import postgres

NOWHERE = "postgresql://postgres@127.0.0.1:1/test"  # port 1: refused at once


def test_an_unreachable_server_skips_with_how_to_enable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "ADMIN_URL", NOWHERE)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="PARLEY_TEST_POSTGRES_URL") as skipped:
        postgres.require_postgres()
    assert "\n" not in str(skipped.value)


def test_under_ci_an_unreachable_server_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "ADMIN_URL", NOWHERE)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true requires PostgreSQL"):
        postgres.require_postgres()


def test_a_run_database_is_created_and_dropped() -> None:
    postgres.require_postgres()
    database = postgres.ScratchDatabase.create()
    try:
        with database.connect() as conn:
            assert conn.execute("SELECT current_database()").fetchone() == (database.name,)
    finally:
        database.drop()
    with postgres.ScratchDatabase("test").connect() as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (database.name,)
        ).fetchone()
    assert found == (0,)
