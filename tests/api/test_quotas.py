"""Quotas (`api.quotas`): one participant, or one address sending unknown keys, cannot crowd
out the others; past a quota the registry answers 429 with `Retry-After`, before the work.
On SQLite and PostgreSQL, with the quotas' clock stopped so that nothing refills meanwhile."""

from __future__ import annotations

import time
from contextlib import ExitStack

import httpx
import pytest

from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import hash_key
from api.errors import TooManyRequests
from api.quotas import FEED_SLOT_S, FEED_STREAMS, RATES, Quotas
from api.settings import Settings
from tests.api.conftest import ADMIN_KEY
from tests.registry_server import running_registries


@pytest.fixture
def clock(registry):
    now = [0.0]
    registry.client.app.state.quotas = Quotas(clock=lambda: now[0])
    return now


def _refused(response) -> None:
    assert response.status_code == 429, response.text
    assert "quota" in response.json()["detail"] or "streams open" in response.json()["detail"]
    assert int(response.headers["Retry-After"]) >= 1


def test_a_participant_reports_at_most_its_burst_of_events_then_waits(registry, clock):
    a, b = registry.participant("a"), registry.participant("b")
    event = {"kind": "agent.note", "message": "m"}
    burst = int(RATES["events"].burst)
    assert {registry.call("POST", "/events", a, json=event).status_code for _ in range(burst)} == {201}
    _refused(registry.call("POST", "/events", a, json=event))
    assert registry.call("POST", "/events", b, json=event).status_code == 201, "another participant's quota is its own"
    clock[0] += 1.0
    assert [registry.call("POST", "/events", a, json=event).status_code for _ in range(int(RATES["events"].per_s) + 1)][-2:] == [201, 429]


def test_a_participant_proposes_at_most_its_burst_of_contracts(registry, clock):
    a = registry.participant("a")
    names = [f"s{i}" for i in range(int(RATES["proposals"].burst) + 1)]
    for name in names:
        registry.participant(name)
    statuses = [registry.call("POST", "/contracts", a, json={"counterparty": n, "price_min": 1.0, "price_max": 2.0, "min_duration_s": 5}).status_code
                for n in names]
    assert statuses[:-1] == [201] * (len(names) - 1)
    _refused(registry.call("POST", "/contracts", a, json={"counterparty": names[-1], "price_min": 1.0, "price_max": 2.0, "min_duration_s": 5}))


def test_an_address_sending_unknown_keys_is_refused_before_its_next_key_is_looked_up(registry, clock):
    a = registry.participant("a")
    burst = int(RATES["bad_keys"].burst)
    assert {registry.call("GET", "/me", f"made-up-{i}").status_code for i in range(burst)} == {401}
    _refused(registry.call("GET", "/me", "made-up-again"))
    _refused(registry.call("GET", "/me", a))  # the address waits, whatever key it sends now
    assert registry.call("GET", "/me", None).status_code == 401, "no key at all costs no lookup and counts for nothing"
    clock[0] += 1.0 / RATES["bad_keys"].per_s
    assert registry.call("GET", "/me", a).status_code == 200


def test_the_workers_of_one_registry_take_from_the_same_quotas(registry, clock):
    """Two workers (two apps on one database): a participant's events and an address's unknown
    keys count against one bucket, whichever worker each request reaches."""
    a = registry.participant("a")
    event = {"kind": "agent.note", "message": "m"}
    with TestClient(create_app(Settings(database_url=registry.url), admin_key=ADMIN_KEY, migrate=False, clock=registry.clock)) as other:
        other.app.state.quotas = Quotas(clock=lambda: clock[0])
        workers = [registry.client, other]

        def call(i: int, method: str, path: str, key: str, **kwargs):
            return workers[i % 2].request(method, "/api/v1" + path, headers=registry.as_key(key), **kwargs)

        assert {call(i, "POST", "/events", a, json=event).status_code for i in range(int(RATES["events"].burst))} == {201}
        _refused(call(0, "POST", "/events", a, json=event))
        _refused(call(1, "POST", "/events", a, json=event))
        assert {call(i, "GET", "/me", f"made-up-{i}").status_code for i in range(int(RATES["bad_keys"].burst))} == {401}
        _refused(call(0, "GET", "/me", "made-up-again"))
        _refused(call(1, "GET", "/me", "made-up-again"))
        _refused(call(1, "GET", "/me", a))  # each worker that refused the address refuses it before any lookup
        clock[0] += 1.0 / RATES["bad_keys"].per_s
        assert call(0, "GET", "/me", a).status_code == 200


def test_one_key_holds_a_few_change_feed_streams_at_once_whichever_worker_serves_them(registry, tmp_path):
    """Two registry processes on one database: a key's streams on both hold its slots, at most
    `FEED_STREAMS` in all; a stream the client closes frees its slot for a stream on the other."""
    a = registry.participant("a")
    with running_registries(tmp_path, registry.url, 2) as workers, ExitStack() as held:
        clients = [held.enter_context(httpx.Client(base_url=w.url, headers=registry.as_key(a), timeout=10)) for w in workers]
        streams = [held.enter_context(clients[i % 2].stream("GET", "/api/v1/changes/stream")) for i in range(FEED_STREAMS)]
        assert [s.status_code for s in streams] == [200] * FEED_STREAMS
        for client in clients:
            _refused(client.get("/api/v1/changes/stream"))
        streams[0].close()  # on the first worker, which frees its slot once it sees the client gone
        deadline = time.monotonic() + 15
        again = held.enter_context(clients[1].stream("GET", "/api/v1/changes/stream"))
        while again.status_code == 429 and time.monotonic() < deadline:
            again.close()
            time.sleep(0.2)
            again = held.enter_context(clients[1].stream("GET", "/api/v1/changes/stream"))
        assert again.status_code == 200, again.read()
        _refused(clients[0].get("/api/v1/changes/stream"))


def test_a_stream_s_slot_is_free_again_when_it_ends_or_when_its_worker_stops_renewing_it(registry, clock):
    a, b = hash_key(registry.participant("a")), hash_key(registry.participant("b"))
    quotas = registry.client.app.state.quotas
    with registry.client.app.state.engine.begin() as db:
        slots = [quotas.open_stream(db, a, "a") for _ in range(FEED_STREAMS)]
        assert sorted(s.slot for s in slots) == list(range(FEED_STREAMS))
        with pytest.raises(TooManyRequests, match="streams open"):
            quotas.open_stream(db, a, "a")
        quotas.close_stream(db, slots[0])
        slots[0] = quotas.open_stream(db, a, "a")
        assert slots[0].slot == 0, "an ended stream's slot"
        clock[0] += FEED_SLOT_S - 1
        assert quotas.renew_stream(db, slots[1]), "renewed within its time"
        clock[0] += 2  # the others, unrenewed past their time: a worker that died held them
        again = [quotas.open_stream(db, a, "a") for _ in range(FEED_STREAMS - 1)]
        assert slots[1].slot not in {s.slot for s in again}
        assert not quotas.renew_stream(db, slots[2]), "a slot lost is not renewed: its stream ends"
        assert quotas.open_stream(db, b, "b").slot == 0, "another key's slots are its own"
