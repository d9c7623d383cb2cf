"""Engine, sessions and the declarative base.

The request (or the agent's loop step) owns the transaction: services only `flush()`.
On SQLite, writing requests open their transaction with `BEGIN IMMEDIATE`, so two
concurrent writers queue on the database lock instead of failing when a read lock
would have to be upgraded; WAL keeps readers running beside the writer.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import DateTime, Engine, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, sessionmaker
from sqlalchemy.types import TypeDecorator


class Base(DeclarativeBase):
    pass


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always returned timezone-aware (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


# Requests that hold a database connection at once (`api.deps`): well below the worker threads
# (anyio's 40) and the connections each pool below may open, so neither waits for the other.
REQUEST_TURNS = 8


def make_engine(url: str) -> Engine:
    """An engine for `url`, tuned for concurrent requests on SQLite or PostgreSQL."""
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=8,
            max_overflow=32,
        )
        _prepare_sqlite(engine)
        return engine
    return create_engine(url, pool_size=10, max_overflow=40, pool_pre_ping=True)


def _prepare_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # Let SQLAlchemy, not the driver, issue BEGIN so that we choose its kind.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        kind = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {kind}")


def session_factories(engine: Engine) -> tuple[sessionmaker, sessionmaker]:
    """(reader, writer) session factories; the writer takes SQLite's write lock up front."""
    reader = sessionmaker(engine, expire_on_commit=False)
    writer_engine = engine.execution_options(sqlite_begin="IMMEDIATE") if engine.dialect.name == "sqlite" else engine
    writer = sessionmaker(writer_engine, expire_on_commit=False)
    return reader, writer


def insert_on_conflict(dialect: str, table: Table):
    """INSERT into `table` with the `ON CONFLICT` clauses of `dialect` (PostgreSQL's or SQLite's)."""
    return (postgresql if dialect == "postgresql" else sqlite).insert(table)
