"""The database's schema at the launcher's start: brought to the migrations' head (alembic, migrations/),
or, with PARLEY_MIGRATE=0, checked to be there already.

On PostgreSQL every migration run holds an advisory lock to its commit (migrations/env.py,
engine.MIGRATION_LOCK): replicas that start at once take turns, and the later ones find the database at
head and do nothing. Alembic is imported here only, and only when a migration is due: a start at head
reads the database's revision with one query and the head from the migration files' own lines (its
import cost ~0.1-0.3 s of a cold start).
"""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import create_engine, inspect, pool, text
from sqlalchemy.engine import make_url

from app.errors.storage import storage_refusal
from app.storage.engine import ensure_sqlite_dir, sync_url

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger("parley")

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC_INI = ROOT / "alembic.ini"
VERSIONS = ROOT / "migrations" / "versions"
# What SQLite says on a full disk: it has no room for the page (storage_full), or for the WAL's index file
# it needs even to read (storage_error, "disk I/O error").
STORAGE_FULL = ("storage_full", "storage_error")
HOW_TO_MIGRATE = "`make migrate`, or `alembic upgrade head` with the same PARLEY_DATABASE_URL"


class SchemaError(Exception):
    """The schema is not at head and may not be brought there: the message is one line that says how."""


@dataclass(frozen=True)
class Revisions:
    current: str | None
    head: str | None

    @property
    def at_head(self) -> bool:
        return self.current == self.head


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config(str(ALEMBIC_INI))
    config.attributes["url"] = sync_url(url)
    config.attributes["configure_logger"] = False  # the service's logging stays as configured
    return config


def revisions(url: str) -> Revisions:
    """The database's revision (None: never migrated) and the migrations' head."""
    return Revisions(current_revision(url), head_of_files() or alembic_head(url))


def current_revision(url: str) -> str | None:
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            if not inspect(connection).has_table("alembic_version"):
                return None
            found = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    finally:
        engine.dispose()
    return str(found[0]) if len(found) == 1 else None


def head_of_files(versions: Path = VERSIONS) -> str | None:
    """The one revision no migration file names as its down_revision, read from the files' module-level
    `revision` and `down_revision` lines; None when they do not say it plainly (alembic then decides)."""
    revisions: set[str] = set()
    downs: set[str] = set()
    for path in versions.glob("*.py"):
        try:
            values = _assignments(ast.parse(path.read_text(encoding="utf-8")))
        except (OSError, SyntaxError, ValueError):
            return None
        revision, down = values.get("revision"), values.get("down_revision")
        if not isinstance(revision, str) or not (down is None or isinstance(down, str)):
            return None
        revisions.add(revision)
        if down is not None:
            downs.add(down)
    heads = revisions - downs
    return heads.pop() if len(heads) == 1 else None


def _assignments(module: ast.Module) -> dict[str, object]:
    found: dict[str, object] = {}
    for node in module.body:
        target, value = (
            (node.target, node.value)
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0], node.value)
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            else (None, None)
        )
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            found[target.id] = value.value
        elif isinstance(target, ast.Name) and value is not None:
            found[target.id] = ...  # not a plain constant: the caller lets alembic decide
    return found


def alembic_head(url: str) -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def upgrade(url: str) -> list[str]:
    """Migrates the database to head; the revisions this call applied (none when another process, a
    replica starting at the same time, got there first)."""
    ensure_sqlite_dir(sync_url(url))
    if revisions(url).at_head:  # the usual start: no alembic import, no migration environment to run
        return []
    from alembic import command

    applied: list[str] = []
    config = alembic_config(url)
    config.attributes["on_version_apply"] = [lambda step, **_: applied.extend(step.up_revision_ids)]
    command.upgrade(config, "head")  # under the advisory lock on PostgreSQL
    return applied


def prepare(url: str, *, migrate: bool) -> None:
    """The schema at head before the server binds: migrated (`migrate`), else checked. Raises SchemaError
    with one line for the operator."""
    where = make_url(url).render_as_string(hide_password=True)
    try:
        if migrate:
            applied = upgrade(url)
            if applied:
                log.info("migrated the database %s to %s (%d migrations)", where, applied[-1], len(applied))
            return
        found = revisions(url)
    except Exception as exc:
        refusal = storage_refusal(exc)
        if refusal is not None and refusal.code in STORAGE_FULL:
            # SQLite on a full disk (it cannot even create the file it reads a WAL database through): the
            # server serves what it can, 503s for the rest, and recovers once space is freed.
            log.warning(
                "cannot check the database %s's migration now (%s: %s): serving anyway",
                where,
                refusal.code,
                " ".join(str(exc).split())[:200],
            )
            return
        detail = " ".join(str(exc).split())[:300]
        doing = "migrate" if migrate else "read the schema version of"
        raise SchemaError(f"cannot {doing} the database {where}: {type(exc).__name__}: {detail}") from exc
    if not found.at_head:
        state = f"is at migration {found.current}" if found.current else "was never migrated"
        raise SchemaError(
            f"the database {where} {state} (this version needs {found.head}) and PARLEY_MIGRATE=0: "
            f"migrate it with {HOW_TO_MIGRATE}, or start without PARLEY_MIGRATE=0"
        )
