"""Alembic environment: the URL comes from the caller's Config, else from BPM settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from api import models  # noqa: F401  (registers the tables on Base.metadata)
from api.db import Base, make_engine
from api.settings import get_settings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or get_settings().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


# Registries started at once on one PostgreSQL database (machines behind a load balancer)
# migrate it one after the other: each takes this lock for its migration's transaction, and
# the next finds the schema at head. PostgreSQL's DDL is transactional, so a registry that
# fails half-way leaves nothing behind. (SQLite has one writer, the registry's own.)
MIGRATION_LOCK = 0x62706D  # "bpm"


def _run(connection) -> None:
    # Batch mode lets the same scripts alter tables on SQLite, which lacks ALTER COLUMN.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": MIGRATION_LOCK})
        context.run_migrations()
    connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
