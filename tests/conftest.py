"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import socket

import pytest

from spark_agents.broker.server import free_port  # noqa: F401 - the suite's one way to pick a port

POSTGRES_URL = os.environ.get("BPM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def postgres_reachable(url: str = POSTGRES_URL) -> bool:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    try:
        with socket.create_connection((parsed.host or "127.0.0.1", parsed.port or 5432), timeout=1):
            return True
    except OSError:
        return False


def require_postgres() -> str:
    """A PostgreSQL database of this test run's own, or a skip when no server runs here (CI
    sets the URL and never skips). The run makes it on the server of BPM_TEST_POSTGRES_URL at
    its first use, named after that URL's database and this process, and drops it when the
    run ends: another run on the same machine (another checkout's tests) can then not empty
    the database under this one's tests. Without the right to create one, the URL's own."""
    if not postgres_reachable():
        if os.environ.get("CI") or os.environ.get("BPM_TEST_POSTGRES_URL"):
            pytest.fail(f"PostgreSQL is required here but {POSTGRES_URL} is unreachable")
        pytest.skip("no PostgreSQL server at 127.0.0.1:5432")
    if not _RUN_DATABASE:
        _RUN_DATABASE.append(_create_run_database())
    return _RUN_DATABASE[0]


_RUN_DATABASE: list[str] = []


def _admin(statement: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(statement))
    finally:
        engine.dispose()


def _create_run_database() -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    base = make_url(POSTGRES_URL)
    name = f"{base.database}_run_{os.getpid()}"
    try:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # left by a run of a reused pid that was killed
        _admin(f'CREATE DATABASE "{name}"')
    except SQLAlchemyError:
        return POSTGRES_URL
    return base.set(database=name).render_as_string(hide_password=False)


def pytest_sessionfinish(session, exitstatus):
    """Drop the run's own PostgreSQL database, if it made one."""
    from sqlalchemy.engine import make_url

    for url in _RUN_DATABASE:
        if url != POSTGRES_URL:
            _admin(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')



