"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from spark_agents.broker.server import free_port  # noqa: F401 - the suite's one way to pick a port

T = TypeVar("T")


def missing(what: str) -> None:
    """What a test needs is not on this machine: a skip on a developer's machine, a failure
    under CI (`CI` set), where the project's own scripts install everything a test needs."""
    if os.environ.get("CI"):
        pytest.fail(f"required here (CI is set): {what}")
    pytest.skip(what)


def requires(reason: str | None, what: str) -> pytest.MarkDecorator:
    """Mark a test as needing something the machine may lack: `reason` says why it cannot be
    had here (None: it can). Such a test is skipped on a developer's machine and fails under
    CI (`pytest_runtest_setup`), never skipped silently there."""
    return pytest.mark.requires(reason=reason, what=what)



def requires_hosts() -> pytest.MarkDecorator:
    """`requires` for a test that makes participants hosts of their own: network namespaces and CPU cgroups."""
    from spark_agents.hosts import CpuHosts
    from spark_agents.network import HostNetwork

    return requires(HostNetwork.available() or CpuHosts.available(), "hosts: network namespaces and CPU cgroups (root)")

def pytest_configure(config):
    """SIGTERM (a CI job cancelled, a timeout of the runner) ends the run as Ctrl-C does: the
    running test's `finally` blocks and fixtures remove the hosts, cgroups and processes it made."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The slow end-to-end tests first, each group in its own order: the parallel workers
    take tests in this order, and a long test taken last would leave the other workers
    idle while it runs alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_setup(item):
    for mark in item.iter_markers("requires"):
        if mark.kwargs["reason"] is not None:
            missing(f"{mark.kwargs['what']}: {mark.kwargs['reason']}")


def wait_until(condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """The first truthy value `condition` returns, polled every `interval_s`; AssertionError
    naming `what` (and the last value) once `timeout_s` has passed. The suite's one way to
    wait for a state or an event: a check that something did not happen waits for the event
    after which it would have happened, then looks, instead of sleeping."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s (last: {value!r})")
        time.sleep(interval_s)


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
        if os.environ.get("BPM_TEST_POSTGRES_URL"):
            pytest.fail(f"PostgreSQL is required here but {POSTGRES_URL} is unreachable")
        missing(f"a PostgreSQL server at {POSTGRES_URL}")
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



