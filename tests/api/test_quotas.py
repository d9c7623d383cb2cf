"""Quotas (`api.quotas`): one participant, or one address sending unknown keys, cannot crowd
out the others; past a quota the registry answers 429 with `Retry-After`, before the work.
On SQLite and PostgreSQL, with the quotas' clock stopped so that nothing refills meanwhile."""

from __future__ import annotations

import pytest

from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import hash_key
from api.quotas import FEED_STREAMS, RATES, Quotas
from api.settings import Settings
from tests.api.conftest import ADMIN_KEY


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


def test_one_key_holds_a_few_change_feed_streams_at_once(registry):
    a = registry.participant("a")
    quotas = registry.client.app.state.quotas
    ends = [quotas.open_stream(hash_key(a), "a") for _ in range(FEED_STREAMS)]
    _refused(registry.call("GET", "/changes/stream", a))
    ends[0]()
    ends[0]()  # counted closed once only
    assert quotas.open_stream(hash_key(a), "a") is not None
    with pytest.raises(Exception, match="streams open"):
        quotas.open_stream(hash_key(a), "a")
