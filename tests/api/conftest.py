"""Registry fixtures: a database built by the real migrations on SQLite and PostgreSQL, a stepped clock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text

from api.app import create_app
from api.db import Base, make_engine
from api.migrate import downgrade, upgrade
from api.settings import Settings
from tests.conftest import require_postgres

ADMIN_KEY = "test-operator-key"


@dataclass
class Clock:
    """The registry's clock, stepped by tests instead of sleeping."""

    now: datetime = field(default_factory=lambda: datetime(2026, 1, 1, 12, 0, tzinfo=UTC))

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_url(request, tmp_path_factory) -> Iterator[str]:
    """A migrated database per backend; tests empty it between them (see `registry`)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('registry') / 'registry.db'}"
    else:
        url = require_postgres()
        downgrade(url, "base")
    upgrade(url)
    yield url
    if request.param == "postgresql":
        downgrade(url, "base")


def _empty(url: str) -> None:
    engine = make_engine(url)
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for table in tables:
                conn.execute(text(f"DELETE FROM {table}"))
    engine.dispose()


@dataclass
class Registry:
    client: TestClient
    clock: Clock
    url: str

    def as_key(self, key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def call(self, method: str, path: str, key: str | None = ADMIN_KEY, **kwargs):
        headers = {**self.as_key(key), **kwargs.pop("headers", {})}
        return self.client.request(method, "/api/v1" + path, headers=headers, **kwargs)

    def ok(self, method: str, path: str, key: str | None = ADMIN_KEY, status: int = 200, **kwargs):
        response = self.call(method, path, key, **kwargs)
        assert response.status_code == status, response.text
        return response.json()

    def participant(self, name: str) -> str:
        body = self.ok("POST", "/participants", json={"name": name, "endpoint": f"http://127.0.0.1:9000/{name}"}, status=201)
        return body["api_key"]

    def active_contract(self, a_key: str, b_name: str, b_key: str, price_min=1.0, price_max=2.0, duration=10.0, **terms) -> dict:
        body = {"counterparty": b_name, "price_min": price_min, "price_max": price_max, "min_duration_s": duration, **terms}
        contract = self.ok("POST", "/contracts", a_key, status=201, json=body)
        return self.ok("POST", f"/contracts/{contract['id']}/accept", b_key)

    def task(self, key: str, name: str, load: float = 0.1) -> dict:
        return self.ok("POST", "/tasks", key, status=201, json={"name": name, "load": load})


@pytest.fixture
def registry(database_url) -> Iterator[Registry]:
    _empty(database_url)
    clock = Clock()
    app = create_app(Settings(database_url=database_url), admin_key=ADMIN_KEY, migrate=False, clock=clock)
    with TestClient(app) as client:
        on_loop = _statements_on_the_event_loop(client.app.state.engine)
        yield Registry(client=client, clock=clock, url=database_url)
    assert not on_loop, f"statements ran on the event loop, where they block every request: {on_loop[:3]}"


def _statements_on_the_event_loop(engine) -> list[str]:
    """The statements `engine` runs from a thread with a running event loop, from now on."""
    ran: list[str] = []

    def check(_conn, _cursor, statement, *_args) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        ran.append(statement)

    event.listen(engine, "before_cursor_execute", check)
    return ran
