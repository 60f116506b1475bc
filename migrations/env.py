"""Alembic environment: migrates the database named by PARLEY_DATABASE_URL (or -x url=...)."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool, text
from sqlmodel import SQLModel

import app.storage.tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from app.settings import Settings
from app.storage.engine import MIGRATION_LOCK, ensure_sqlite_dir, sync_url

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = SQLModel.metadata


def _url() -> str:
    override = context.get_x_argument(as_dictionary=True).get("url") or config.attributes.get("url")
    return str(override) if override else Settings().sync_database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = sync_url(_url())
    ensure_sqlite_dir(url)
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=True,
            # The launcher's way to learn which steps this run applied (app/storage/schema.py).
            on_version_apply=config.attributes.get("on_version_apply", ()),
        )
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":  # replicas starting at once take turns
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
