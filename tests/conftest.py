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
    """The PostgreSQL URL, or a skip when none runs here; CI sets the URL and never skips."""
    if postgres_reachable():
        return POSTGRES_URL
    if os.environ.get("CI") or os.environ.get("BPM_TEST_POSTGRES_URL"):
        pytest.fail(f"PostgreSQL is required here but {POSTGRES_URL} is unreachable")
    pytest.skip("no PostgreSQL server at 127.0.0.1:5432")



