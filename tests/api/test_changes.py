"""The change feed (`api.services.changes`): every change leaves a notice for each participant it
concerns and no other, returned by the heartbeat until acknowledged; on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event

from tests.api.conftest import ADMIN_KEY
from tests.api.test_ha import beat, silence


def feed(registry, key: str, name: str, acknowledged=()) -> dict:
    return registry.ok("POST", f"/participants/{name}/heartbeat", key, json={"load": 0.1, "acknowledged": list(acknowledged)})


def kinds(body: dict) -> list[str]:
    return [c["kind"] for c in body["changes"]]


def drain(registry, keys: dict[str, str]) -> None:
    """Every participant acknowledges what it has been told so far."""
    for name, key in keys.items():
        feed(registry, key, name, [c["id"] for c in feed(registry, key, name)["changes"]])


def test_a_change_notifies_exactly_the_participants_it_concerns_until_they_acknowledge(registry):
    keys = {name: registry.participant(name) for name in "abc"}
    contract = registry.active_contract(keys["a"], "b", keys["b"])
    task = registry.task(keys["a"], "t0", load=0.3)
    assert kinds(feed(registry, keys["a"], "a")) == ["contract", "contract", "task"]  # proposed, accepted, registered
    assert kinds(feed(registry, keys["b"], "b")) == ["contract", "contract"]
    assert kinds(feed(registry, keys["c"], "c")) == []  # no contract, no task: c hears of nothing
    # Unacknowledged notices stay; acknowledged ones go, and only one's own.
    first = feed(registry, keys["a"], "a")["changes"]
    assert feed(registry, keys["b"], "b", [c["id"] for c in first])["changes"] != []
    assert feed(registry, keys["a"], "a", [c["id"] for c in first])["changes"] == []
    assert len(feed(registry, keys["a"], "a")["changes"]) == 0
    drain(registry, keys)

    offer = registry.ok("POST", "/offers", keys["a"], status=201, json={"contract_id": contract["id"], "task_ids": [task["id"]], "price": 1.5})
    assert kinds(feed(registry, keys["b"], "b")) == ["offer"]
    registry.ok("POST", f"/offers/{offer['id']}/accept", keys["b"])
    for name in "ab":  # the offer's answer, then the task that moved (from a to b)
        assert kinds(feed(registry, keys[name], name)) == ["offer", "offer", "task"], name
    assert kinds(feed(registry, keys["c"], "c")) == []
    drain(registry, keys)

    movement = registry.ok("GET", "/movements", keys["a"])[0]
    registry.clock.advance(11)
    registry.ok("POST", f"/movements/{movement['id']}/end", keys["a"])
    assert kinds(feed(registry, keys["a"], "a")) == kinds(feed(registry, keys["b"], "b")) == ["task"]


def test_the_heartbeat_carries_the_liveness_of_the_participants_that_concern_it_only(registry):
    keys = {name: registry.participant(name) for name in "abc"}
    registry.active_contract(keys["a"], "b", keys["b"])
    beat(registry, keys, *"ab")
    assert feed(registry, keys["a"], "a")["partners"] == {"b": "alive"}
    assert feed(registry, keys["c"], "c")["partners"] == {}  # c has nothing to do with a or b
    registry.clock.advance(7)  # b falls silent: past twice the timeout
    assert feed(registry, keys["a"], "a")["partners"] == {"b": "failed"}


def test_a_passed_on_task_notifies_the_whole_chain_when_it_fails_over(registry):
    keys = {name: registry.participant(name) for name in "abc"}
    first = registry.active_contract(keys["a"], "b", keys["b"])
    onward = registry.active_contract(keys["b"], "c", keys["c"])
    task = registry.task(keys["a"], "t0")
    offer = registry.ok("POST", "/offers", keys["a"], status=201, json={"contract_id": first["id"], "task_ids": [task["id"]], "price": 1.5})
    registry.ok("POST", f"/offers/{offer['id']}/accept", keys["b"])
    offer = registry.ok("POST", "/offers", keys["b"], status=201, json={"contract_id": onward["id"], "task_ids": [task["id"]], "price": 1.5})
    registry.ok("POST", f"/offers/{offer['id']}/accept", keys["c"])
    assert "task" in kinds(feed(registry, keys["a"], "a"))  # the origin hears that its task moved on, though not a party to the offer
    drain(registry, keys)

    silence(registry, keys, "c")
    drain(registry, {n: keys[n] for n in "ab"})
    registry.ok("POST", f"/tasks/{task['id']}/failover", keys["a"], status=201, json={"to": "a", "expected_epoch": 2})
    for name in "abc":  # the new host, the middle of the ended chain, and the failed host when it comes back
        assert kinds(feed(registry, keys[name], name)) == ["task"], name


def test_a_participant_cannot_acknowledge_another_s_notices(registry):
    keys = {name: registry.participant(name) for name in "ab"}
    registry.active_contract(keys["a"], "b", keys["b"])
    theirs = [c["id"] for c in feed(registry, keys["b"], "b")["changes"]]
    feed(registry, keys["a"], "a", theirs)
    assert [c["id"] for c in feed(registry, keys["b"], "b")["changes"]] == theirs
    bad = registry.call("POST", "/participants/a/heartbeat", keys["a"], json={"load": 0.1, "acknowledged": ["x"]})
    assert bad.status_code == 422 and "detail" in bad.json()
    assert registry.call("POST", "/participants/a/heartbeat", keys["a"], json={"load": 0.1, "acknowledged": [0]}).status_code == 422


@contextmanager
def statements(registry) -> Iterator[list[str]]:
    """The SQL statements the registry runs meanwhile (each execution of an executemany counts once)."""
    seen: list[str] = []
    engine = registry.client.app.state.engine

    def count(conn, cursor, statement, parameters, context, executemany):
        seen.append(" ".join(statement.split())[:90])

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_a_heartbeat_costs_the_same_statements_however_many_tasks_and_movements_it_reports(registry):
    keys = {name: registry.participant(name) for name in "ab"}
    contract = registry.active_contract(keys["a"], "b", keys["b"])
    tasks = [registry.task(keys["a"], f"t{i}")["id"] for i in range(12)]
    offer = registry.ok("POST", "/offers", keys["a"], status=201, json={"contract_id": contract["id"], "task_ids": tasks[:6], "price": 1.5})
    registry.ok("POST", f"/offers/{offer['id']}/accept", keys["b"])
    drain(registry, keys)

    def heartbeat(name: str, reported: list[int]) -> list[str]:
        body = {"load": 0.5, "tasks": [{"task_id": t, "load": 0.05} for t in reported]}
        registry.clock.advance(1)
        with statements(registry) as seen:
            registry.ok("POST", f"/participants/{name}/heartbeat", keys[name], json=body)
        return seen

    one, many = heartbeat("b", tasks[:1]), heartbeat("b", tasks[:6])  # hosting and paid for 1, then 6 moved tasks
    assert len(one) == len(many), (one, many)
    assert len(heartbeat("a", tasks[6:])) <= len(one)  # its own six tasks: no movement to pay
    assert len(many) <= 12, many


def test_a_transaction_the_database_aborts_for_a_concurrent_one_is_a_409_to_retry(registry, monkeypatch):
    import psycopg
    from sqlalchemy.exc import OperationalError

    from api.services import heartbeats

    key = registry.participant("a")

    def deadlocked(*args, **kwargs):
        raise OperationalError("UPDATE tasks ...", {}, psycopg.errors.DeadlockDetected("deadlock detected"))

    monkeypatch.setattr(heartbeats, "heartbeat", deadlocked)
    response = registry.call("POST", "/participants/a/heartbeat", key, json={"load": 0.1})
    assert response.status_code == 409 and "retry" in response.json()["detail"]


def test_offer_and_accept_cost_the_same_statements_however_many_tasks(registry):
    """Apart from inserting the movements (one batch on PostgreSQL, one row each on SQLite's driver)."""
    keys = {name: registry.participant(name) for name in "ab"}
    contract = registry.active_contract(keys["a"], "b", keys["b"])
    tasks = [registry.task(keys["a"], f"t{i}")["id"] for i in range(7)]
    drain(registry, keys)
    counts = []
    for chosen in (tasks[:1], tasks[1:]):
        with statements(registry) as made:
            offer = registry.ok("POST", "/offers", keys["a"], status=201, json={"contract_id": contract["id"], "task_ids": chosen, "price": 1.5})
        with statements(registry) as accepted:
            registry.ok("POST", f"/offers/{offer['id']}/accept", keys["b"])
        counts.append((len(made), len([s for s in accepted if not s.startswith("INSERT INTO movements")])))
    assert counts[0] == counts[1], counts
    assert max(counts[0]) <= 16, counts


def test_a_participant_reads_what_concerns_it_in_one_view(registry):
    keys = {name: registry.participant(name) for name in "abc"}
    contract = registry.active_contract(keys["a"], "b", keys["b"], ha_mode="passive_standby")
    tasks = [registry.task(keys["a"], f"t{i}")["id"] for i in range(2)]
    registry.task(keys["c"], "elsewhere")
    offer = registry.ok("POST", "/offers", keys["a"], status=201, json={"contract_id": contract["id"], "task_ids": tasks[:1], "price": 1.5})
    registry.ok("POST", f"/offers/{offer['id']}/accept", keys["b"])
    registry.ok("POST", f"/tasks/{tasks[0]}/replicas", keys["a"], status=201, json={"participant": "a"})
    for name in "ab":
        view = registry.ok("GET", f"/participants/{name}/view", keys[name])
        assert view["tasks"] == registry.ok("GET", "/tasks", keys[name], params={"involving": name})
        assert view["movements"] == registry.ok("GET", "/movements", keys[name], params={"participant": name})
        assert view["replicas"] == registry.ok("GET", "/replicas", keys[name])
        assert view["failovers"] == registry.ok("GET", "/failovers", keys[name])
    assert [t["name"] for t in registry.ok("GET", "/participants/b/view", keys["b"])["tasks"]] == ["t0"]
    assert len(registry.ok("GET", "/participants/a/view", keys["a"])["replicas"]) == 1
    for key in (keys["c"], ADMIN_KEY):  # another participant, the operator: only its own
        refused = registry.call("GET", "/participants/a/view", key)
        assert refused.status_code == 403 and "only a" in refused.json()["detail"]
    assert registry.call("GET", "/participants/a%2F..%2Fx/view", keys["a"]).status_code in (404, 422)
