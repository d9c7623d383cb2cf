"""The admin UI's change feed (`api.services.feed`, `GET /api/v1/changes/stream`): each change
names the lists it changed as the caller reads them, and what changes by the clock alone too;
on SQLite and PostgreSQL."""

from __future__ import annotations

import json

from sqlalchemy import select

from api.models import Participant
from api.services import feed
from tests.api.conftest import ADMIN_KEY


def _marks(registry, participant: str | None = None) -> dict:
    state = registry.client.app.state
    with state.read_session() as session:
        pid = None if participant is None else session.scalar(select(Participant.id).where(Participant.name == participant))
        return feed.marks(session, pid, registry.clock(), state.settings.heartbeat_timeout_s)


def _changed(registry, action, participant: str | None = None) -> set[str]:
    before = _marks(registry, participant)
    action()
    return set(feed.changed(before, _marks(registry, participant)))


def test_each_change_names_the_lists_it_changed(registry):
    assert set(feed.changed(None, _marks(registry))) == set(feed.LISTS), "at first, every list"
    keys = {}
    assert _changed(registry, lambda: keys.update(a=registry.participant("a"), b=registry.participant("b"))) == {"participants", "events"}
    assert _changed(registry, lambda: None) == set(), "nothing happened"
    contract = {}
    assert _changed(registry, lambda: contract.update(registry.active_contract(keys["a"], "b", keys["b"]))) == {"contracts", "events"}
    assert _changed(registry, lambda: registry.task(keys["a"], "t0", load=0.3)) == {"tasks", "events"}
    beat = lambda: registry.ok("POST", "/participants/a/heartbeat", keys["a"], json={"load": 0.5, "threshold": 0.8})  # noqa: E731
    assert {"participants", "tasks"} <= _changed(registry, beat) <= {"participants", "tasks", "movements", "ledger"}
    task = registry.ok("GET", "/tasks")[0]
    offer = {}
    made = _changed(registry, lambda: offer.update(registry.ok("POST", "/offers", keys["a"], status=201,
                                                               json={"contract_id": contract["id"], "task_ids": [task["id"]], "price": 1.5})))
    assert made == {"offers", "events"}, made
    moved = _changed(registry, lambda: registry.ok("POST", f"/offers/{offer['id']}/accept", keys["b"]))
    assert {"offers", "tasks", "movements", "ledger", "events"} <= moved, moved


def test_what_changes_by_the_clock_alone_is_named_too(registry):
    keys = {name: registry.participant(name) for name in "ab"}
    registry.ok("POST", "/participants/a/heartbeat", keys["a"], json={"load": 0.1})
    timeout = registry.client.app.state.settings.heartbeat_timeout_s
    # a falls silent: suspected, then failed, without a write.
    assert _changed(registry, lambda: registry.clock.advance(timeout + 0.5)) == {"participants"}
    assert _changed(registry, lambda: registry.clock.advance(timeout)) == {"participants"}
    assert _changed(registry, lambda: registry.clock.advance(timeout)) == set()
    # A pending offer expires by the clock.
    contract = registry.active_contract(keys["a"], "b", keys["b"])
    task = registry.task(keys["a"], "t0")
    registry.ok("POST", "/offers", keys["a"], status=201, json={"contract_id": contract["id"], "task_ids": [task["id"]], "price": 1.5})
    assert "offers" in _changed(registry, lambda: registry.clock.advance(3600))


def test_a_participant_hears_only_of_what_it_may_read(registry):
    keys = {name: registry.participant(name) for name in "abc"}
    unseen = _changed(registry, lambda: registry.active_contract(keys["a"], "c", keys["c"]), participant="b")
    assert unseen == set(), "a contract between a and c is none of b's business"
    assert {"contracts", "events"} <= _changed(registry, lambda: registry.active_contract(keys["a"], "b", keys["b"]), participant="b")


def _events(lines, count: int) -> list[tuple[str, dict]]:
    """The next `count` events of a server-sent event stream (`lines`: its lines, read as they come)."""
    out, event = [], None
    for line in lines:
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            out.append((event, json.loads(line.removeprefix("data: "))))
            if len(out) == count:
                return out
    return out


def test_the_stream_names_changes_as_they_happen_and_ends_when_the_key_is_revoked(registry):
    state = registry.client.app.state
    state.settings = state.settings.model_copy(update={"feed_interval_s": 0.05, "feed_lifetime_s": 20.0})
    key = registry.participant("a")
    registry.participant("b")
    with registry.client.stream("GET", "/api/v1/changes/stream", headers=registry.as_key(key)) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        [(kind, first)] = _events(lines, 1)
        assert kind == "change" and set(first["lists"]) == set(feed.LISTS) and first["at"].startswith("2026-01-01T12:00")
        registry.ok("POST", "/contracts", key, status=201, json={"counterparty": "b", "price_min": 1, "price_max": 2, "min_duration_s": 10})
        [(kind, told)] = _events(lines, 1)
        assert kind == "change" and {"contracts", "events"} <= set(told["lists"]), told
        registry.ok("DELETE", "/participants/a/key")
        [(kind, last)] = _events(lines, 1)
        assert kind == "revoked" and "invalid API key" in last["detail"]
        assert _events(lines, 1) == [], "the stream ended"


def test_the_stream_refuses_a_wrong_key_as_json_and_is_not_timed(registry):
    refused = registry.call("GET", "/changes/stream", "nope")
    assert refused.status_code == 401 and refused.json()["detail"] == "invalid API key"
    state = registry.client.app.state
    state.settings = state.settings.model_copy(update={"feed_interval_s": 0.05, "feed_lifetime_s": 0.2})
    with registry.client.stream("GET", "/api/v1/changes/stream", headers=registry.as_key(ADMIN_KEY)) as response:
        assert [kind for kind, _ in _events(response.iter_lines(), 10)] == ["change"], "one change, then the stream ends with its lifetime"
    scraped = registry.client.get("/metrics").text
    assert 'route="/api/v1/changes/stream",status="401"' in scraped, "a refusal is timed"
    assert 'route="/api/v1/changes/stream",status="200"' not in scraped, "a stream is not"


def test_replicas_and_failovers_are_heard_of_only_by_whom_they_concern(registry):
    """a's task moved to b with a replica at c: e, with no part in it, hears of neither the
    replica nor its failover (the lists it may read did not change); c hears of both."""
    from tests.api.test_ha import TIMEOUT, add_replica, beat

    keys = {name: registry.participant(name) for name in "abce"}
    registry.active_contract(keys["a"], "b", keys["b"], ha_mode="passive_standby")
    registry.active_contract(keys["a"], "c", keys["c"])
    contract = next(c for c in registry.ok("GET", "/contracts", keys["b"]) if c["state"] == "active")
    task = registry.task(keys["a"], "t0", load=0.1)
    offer = registry.ok("POST", "/offers", keys["a"], status=201, json={"contract_id": contract["id"], "task_ids": [task["id"]], "price": 1.5})
    registry.ok("POST", f"/offers/{offer['id']}/accept", keys["b"])
    beat(registry, keys, *keys)
    before = {p: _marks(registry, p) for p in "ce"}
    add_replica(registry, keys["a"], task["id"], "c")
    assert "replicas" not in feed.changed(before["e"], _marks(registry, "e"))
    assert "replicas" in feed.changed(before["c"], _marks(registry, "c"))
    registry.clock.advance(2 * TIMEOUT + 1)
    beat(registry, keys, "a", "c", "e")
    before = {p: _marks(registry, p) for p in "ce"}
    registry.ok("POST", f"/tasks/{task['id']}/failover", keys["c"], status=201, json={"expected_epoch": 1, "reason": "b is silent", "to": "c"})
    assert not {"replicas", "failovers"} & set(feed.changed(before["e"], _marks(registry, "e")))
    assert {"replicas", "failovers"} <= set(feed.changed(before["c"], _marks(registry, "c")))
