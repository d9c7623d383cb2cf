"""High availability in the registry: replicas, failover rules and fencing, repairs, on SQLite and PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from threading import Barrier

import pytest

TIMEOUT = 3.0  # the registry's default heartbeat timeout


@pytest.fixture
def moved(registry):
    """Origin a moved task t0 to b under a contract asking for `active_standby`; c and d,
    alive, hold contracts with a too (where its replicas and failovers may go).

    Returns (keys by name, task, movement). Every participant has just sent a heartbeat.
    """
    keys = {name: registry.participant(name) for name in "abcd"}
    contract = registry.ok(
        "POST", "/contracts", keys["a"], status=201,
        json={"counterparty": "b", "price_min": 1.0, "price_max": 2.0, "min_duration_s": 60, "ha_mode": "active_standby"},
    )
    registry.ok("POST", f"/contracts/{contract['id']}/accept", keys["b"])
    for partner in "cd":
        registry.active_contract(keys["a"], partner, keys[partner])
    task = registry.task(keys["a"], "t0", load=0.5)
    offer = registry.ok("POST", "/offers", keys["a"], status=201, json={"contract_id": contract["id"], "task_ids": [task["id"]], "price": 2.0})
    accepted = registry.ok("POST", f"/offers/{offer['id']}/accept", keys["b"])
    beat(registry, keys, *"abcd")
    return keys, registry.ok("GET", f"/tasks/{task['id']}"), registry.ok("GET", f"/movements/{accepted['movements'][0]}")


def beat(registry, keys, *names):
    for name in names:
        registry.ok("POST", f"/participants/{name}/heartbeat", keys[name], json={"load": 0.1})


def silence(registry, keys, failed: str, seconds: float = TIMEOUT + 1) -> None:
    """Let `seconds` pass in which everyone but `failed` keeps sending heartbeats."""
    registry.clock.advance(seconds / 2)
    beat(registry, keys, *(n for n in keys if n != failed))
    registry.clock.advance(seconds / 2)
    beat(registry, keys, *(n for n in keys if n != failed))


def add_replica(registry, key, task_id, participant, status=201, **extra):
    return registry.ok("POST", f"/tasks/{task_id}/replicas", key, status=status, json={"participant": participant, **extra})


def test_replica_create_sync_drop(registry, moved):
    keys, task, _ = moved
    assert task["host"] == "b" and task["epoch"] == 1
    replica = add_replica(registry, keys["a"], task["id"], "c")
    assert replica["role"] == "active_standby"  # from the contract, the task itself says none
    assert (replica["task"], replica["participant"], replica["state"], replica["epoch"]) == ("a.t0", "c", "active", 1)
    assert replica["position"] is None and replica["synced_at"] is None and replica["bytes_copied"] == 0
    assert replica["repair_id"] is None
    registry.clock.advance(1)
    synced = registry.ok("POST", f"/replicas/{replica['id']}/sync", keys["c"], json={"epoch": 1, "position": 10, "bytes_copied": 100})
    assert synced["position"] == 10 and synced["bytes_copied"] == 100
    assert datetime.fromisoformat(synced["synced_at"]) == registry.clock.now
    again = registry.ok("POST", f"/replicas/{replica['id']}/sync", keys["b"], json={"epoch": 1, "bytes_copied": 50})
    assert again["position"] == 10 and again["bytes_copied"] == 150
    by_holder = add_replica(registry, keys["b"], task["id"], "d", role="passive_standby")  # the host may place one too
    listed = registry.ok("GET", "/replicas")
    assert [r["id"] for r in listed] == [replica["id"], by_holder["id"]]
    assert [r["id"] for r in registry.ok("GET", "/replicas?participant=d")] == [by_holder["id"]]
    assert registry.ok("GET", f"/replicas?task_id={task['id'] + 1}") == []
    dropped = registry.ok("POST", f"/replicas/{replica['id']}/drop", keys["c"])
    assert dropped["state"] == "dropped"
    assert registry.call("POST", f"/replicas/{replica['id']}/drop", keys["a"]).status_code == 409
    assert registry.call("POST", f"/replicas/{replica['id']}/sync", keys["c"], json={"epoch": 1}).status_code == 409
    # Dropped, the holder may get a fresh replica of the task.
    assert add_replica(registry, keys["a"], task["id"], "c")["id"] != replica["id"]
    kinds = [e["kind"] for e in registry.ok("GET", "/events?kind=replica.")]
    assert kinds == ["replica.created", "replica.created", "replica.dropped", "replica.created"]


def test_replica_refusals(registry, moved):
    keys, task, _ = moved
    tid = task["id"]
    assert registry.call("POST", f"/tasks/{tid}/replicas", keys["c"], json={"participant": "d"}).status_code == 403
    assert registry.call("POST", f"/tasks/{tid}/replicas", json={"participant": "d"}).status_code == 403  # operator
    assert registry.call("POST", f"/tasks/{tid}/replicas", keys["a"], json={"participant": "b"}).status_code == 409  # the host
    assert registry.call("POST", f"/tasks/{tid}/replicas", keys["a"], json={"participant": "zz"}).status_code == 404
    assert registry.call("POST", "/tasks/999/replicas", keys["a"], json={"participant": "c"}).status_code == 404
    assert registry.call("POST", f"/tasks/{tid}/replicas", keys["a"], json={"participant": "c", "role": "hot"}).status_code == 422
    assert registry.call("POST", f"/tasks/{tid}/replicas", keys["a"], json={"participant": "c", "repair_of": 999}).status_code == 404
    replica = add_replica(registry, keys["a"], tid, "c")
    twice = registry.call("POST", f"/tasks/{tid}/replicas", keys["b"], json={"participant": "c"})
    assert twice.status_code == 409 and twice.json()["replica_id"] == replica["id"]
    # A task at home with no HA mode of its own or by contract has no standby role to default to.
    home = registry.task(keys["c"], "plain")
    assert registry.call("POST", f"/tasks/{home['id']}/replicas", keys["c"], json={"participant": "d"}).status_code == 422
    unsigned = registry.call("POST", f"/tasks/{home['id']}/replicas", keys["c"], json={"participant": "d", "role": "passive_standby"})
    assert unsigned.status_code == 403 and "no contract in force" in unsigned.json()["detail"]
    registry.active_contract(keys["c"], "d", keys["d"])
    assert add_replica(registry, keys["c"], home["id"], "d", role="passive_standby")["role"] == "passive_standby"
    sync = f"/replicas/{replica['id']}/sync"
    assert registry.call("POST", sync, keys["a"], json={"epoch": 1}).status_code == 403  # origin: neither holder nor host
    assert registry.call("POST", sync, keys["d"], json={"epoch": 1}).status_code == 403
    assert registry.call("POST", sync, keys["c"], json={"epoch": 5}).status_code == 422
    assert registry.call("POST", sync, keys["c"], json={"epoch": 1, "position": -1}).status_code == 422
    assert registry.call("POST", "/replicas/999/sync", keys["c"], json={"epoch": 1}).status_code == 404
    assert registry.call("POST", f"/replicas/{replica['id']}/drop", keys["d"]).status_code == 403
    # What a participant reads: replicas of tasks it originates, hosts or holds; the operator reads all.
    assert [r["task_id"] for r in registry.ok("GET", "/replicas", keys["d"])] == [home["id"]]
    assert len(registry.ok("GET", "/replicas")) == 2
    assert registry.call("GET", "/replicas", None).status_code == 401


def test_replicas_and_failovers_go_only_to_the_origin_or_its_partners(registry, moved):
    """Nobody keeps or runs a task without a contract in force with its origin: not a
    stranger the origin or host names, not a partner whose contract ended."""
    keys, task, _ = moved
    tid = task["id"]
    keys["e"] = registry.participant("e")  # alive, but no contract with a
    for by in "ab":
        refused = registry.call("POST", f"/tasks/{tid}/replicas", keys[by], json={"participant": "e"})
        assert refused.status_code == 403 and "no contract in force with task #" in refused.json()["detail"], refused.text
    contract_ac = next(c for c in registry.ok("GET", "/contracts", keys["c"]) if c["state"] == "active")
    registry.ok("POST", f"/contracts/{contract_ac['id']}/terminate", keys["a"])
    assert registry.call("POST", f"/tasks/{tid}/replicas", keys["a"], json={"participant": "c"}).status_code == 403
    replica = add_replica(registry, keys["a"], tid, "d")
    silence(registry, keys, "b")
    body = {"expected_epoch": 1, "reason": "b is silent"}
    for stranger in "ce":
        refused = registry.call("POST", f"/tasks/{tid}/failover", keys["a"], json={**body, "to": stranger})
        assert refused.status_code == 403 and "fails over only to its origin or a contract partner" in refused.json()["detail"], refused.text
    assert registry.ok("GET", f"/tasks/{tid}")["host"] == "b"
    record = registry.ok("POST", f"/tasks/{tid}/failover", keys["d"], status=201, json={**body, "to": "d"})
    assert (record["to_host"], record["to_epoch"]) == ("d", 2)
    states = {r["id"]: r["state"] for r in registry.ok("GET", f"/replicas?task_id={tid}")}
    assert states[replica["id"]] == "promoted"


def test_failover_refused_while_the_host_lives_then_done_with_fencing(registry, moved):
    keys, task, movement = moved
    tid = task["id"]
    replica = add_replica(registry, keys["a"], tid, "c")
    body = {"to": "a", "expected_epoch": 1, "reason": "b is silent"}
    alive = registry.call("POST", f"/tasks/{tid}/failover", keys["a"], json=body)
    assert alive.status_code == 409 and alive.json()["status"] == "alive"
    registry.clock.advance(2.0)
    beat(registry, keys, "a", "c")  # not d: it will be suspected as well
    assert registry.call("POST", f"/tasks/{tid}/failover", keys["a"], json=body).status_code == 409  # b silent 2 s < 3 s
    registry.clock.advance(2.0)  # b silent 4 s: suspected
    assert registry.call("POST", f"/tasks/{tid}/failover", keys["d"], json=body).status_code == 403  # neither origin nor holder
    stale = registry.call("POST", f"/tasks/{tid}/failover", keys["a"], json={**body, "expected_epoch": 0})
    assert stale.status_code == 409 and stale.json()["epoch"] == 1
    assert registry.call("POST", f"/tasks/{tid}/failover", keys["a"], json={**body, "to": "d"}).status_code == 409  # d silent 4 s
    assert registry.call("POST", f"/tasks/{tid}/failover", keys["a"], json={**body, "to": "zz"}).status_code == 404
    record = registry.ok("POST", f"/tasks/{tid}/failover", keys["c"], status=201, json={**body, "to": "c"})
    start = datetime.fromisoformat(movement["started_at"])
    assert (record["kind"], record["mode"], record["failed"], record["from_host"], record["to_host"]) == (
        "failover", "active_standby", "b", "b", "c",
    )
    assert (record["from_epoch"], record["to_epoch"], record["task"], record["reason"]) == (1, 2, "a.t0", "b is silent")
    assert datetime.fromisoformat(record["detected_at"]) == registry.clock.now == datetime.fromisoformat(record["at"])
    assert datetime.fromisoformat(record["started_at"]) == start + timedelta(seconds=TIMEOUT)  # last heartbeat + timeout
    assert record["completed_at"] is None and record["details"]["failed_movement_ids"] == [movement["id"]]
    assert registry.ok("GET", f"/tasks/{tid}")["host"] == "c"
    assert registry.ok("GET", "/replicas")[0]["id"] == replica["id"]
    assert registry.ok("GET", "/replicas")[0]["state"] == "promoted"
    assert registry.call("POST", f"/tasks/{tid}/failover", keys["a"], json={**body, "expected_epoch": 2}).status_code == 409  # c is alive
    # b comes back: its heartbeat is accepted, it sees it no longer hosts the task, its report of it counts for nothing.
    back = registry.ok("POST", "/participants/b/heartbeat", keys["b"], json={"load": 0.9, "tasks": [{"task_id": tid, "load": 0.9}]})
    assert back["status"] == "alive" and back["hosted_tasks"] == []
    assert registry.ok("GET", "/tasks?host=b", keys["b"]) == []
    assert registry.ok("GET", f"/tasks/{tid}")["load"] == 0.5
    assert registry.call("POST", f"/movements/{movement['id']}/end", keys["b"]).status_code == 409
    (failover,) = registry.ok("GET", "/events?kind=task.failover", keys["b"])
    assert "from b (unreachable: silent 4.0 s, suspected)" in failover["message"]
    (healed,) = registry.ok("GET", "/events?kind=participant.healed", keys["b"])
    assert healed["subject"] == "b" and healed["data"] == {"silent_s": 4.0, "failed_over_task_ids": [tid]}
    assert healed["message"] == f"b is reachable again after 4.0 s of silence; failed over from it meanwhile: #{tid} t0 (now epoch 2)"
    beat(registry, keys, "b")
    assert len(registry.ok("GET", "/events?kind=participant.healed", keys["b"])) == 1, "only after a silence"
    assert registry.ok("GET", "/failovers", keys["b"])[0]["id"] == record["id"]  # b, the failed host, reads it


def test_failed_movement_stops_payments_and_the_ledger_balances(registry, moved):
    keys, task, movement = moved
    registry.clock.advance(10)
    beat(registry, keys, "a")
    silence(registry, keys, "b")  # 4 more seconds
    registry.ok("POST", f"/tasks/{task['id']}/failover", keys["a"], status=201, json={"to": "a", "expected_epoch": 1})
    ended = registry.ok("GET", f"/movements/{movement['id']}", keys["a"])
    assert ended["state"] == "failed" and datetime.fromisoformat(ended["ended_at"]) == registry.clock.now
    registry.clock.advance(100)
    ledger = registry.ok("GET", "/ledger")
    assert [round(e["amount"], 9) for e in ledger["entries"]] == [2.0 * 0.5 * 14]
    balances = {b["participant"]: b["balance"] for b in ledger["balances"]}
    assert balances == {"a": pytest.approx(-14.0), "b": pytest.approx(14.0)}
    # Home again, the task can be offered anew.
    home = registry.ok("GET", f"/tasks/{task['id']}")
    assert (home["host"], home["away"], home["epoch"]) == ("a", False, 2)


def test_racing_failovers_exactly_one_wins(registry, moved):
    keys, task, _ = moved
    add_replica(registry, keys["a"], task["id"], "c")
    silence(registry, keys, "b")
    barrier = Barrier(4)

    def request(name: str) -> int:
        barrier.wait()
        target = "a" if name == "a" else "c"
        return registry.call("POST", f"/tasks/{task['id']}/failover", keys[name], json={"to": target, "expected_epoch": 1}).status_code

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(request, ["a", "c", "a", "c"]))
    assert sorted(codes) == [201, 409, 409, 409]
    assert len(registry.ok("GET", "/failovers")) == 1
    assert registry.ok("GET", f"/tasks/{task['id']}")["epoch"] == 2


def test_second_failure_fails_the_promoted_replica_and_repair_restores_the_level(registry, moved):
    keys, task, _ = moved
    tid = task["id"]
    add_replica(registry, keys["a"], tid, "c")
    silence(registry, keys, "b")
    first = registry.ok("POST", f"/tasks/{tid}/failover", keys["c"], status=201, json={"to": "c", "expected_epoch": 1})
    # The new host reports recovery; details add to what the registry recorded, and never change it
    # (others act on the replicas, movements and requester it names).
    for forged in ({"promoted_replica_ids": []}, {"requested_by": "b", "replayed": 12}):
        refused = registry.call("POST", f"/failovers/{first['id']}/complete", keys["c"], json={"recovery_s": 0.4, "details": forged})
        assert refused.status_code == 422 and "recorded when it began" in refused.json()["detail"], refused.text
    done = registry.ok("POST", f"/failovers/{first['id']}/complete", keys["c"], json={"recovery_s": 0.4, "details": {"replayed": 12}})
    assert done["recovery_s"] == 0.4 and done["details"]["replayed"] == 12 and "requested_by" in done["details"]
    assert datetime.fromisoformat(done["completed_at"]) == registry.clock.now
    assert registry.call("POST", f"/failovers/{first['id']}/complete", keys["c"]).status_code == 409
    # Repair: the host places a new replica at d, as a repair of the failover.
    repaired = add_replica(registry, keys["c"], tid, "d", repair_of=first["id"])
    assert repaired["repair_id"] is not None and repaired["epoch"] == 2
    repair = registry.ok("GET", f"/failovers?task_id={tid}")[-1]
    assert (repair["id"], repair["kind"], repair["failed"], repair["from_host"], repair["to_host"]) == (
        repaired["repair_id"], "repair", "b", "c", "d",
    )
    assert repair["details"]["repair_of"] == first["id"] and repair["details"]["replica_id"] == repaired["id"]
    assert registry.call("POST", f"/failovers/{repair['id']}/complete", keys["a"]).status_code == 403  # origin, not host
    registry.clock.advance(1.5)
    beat(registry, keys, "a", "b", "c", "d")
    completed = registry.ok("POST", f"/failovers/{repair['id']}/complete", keys["d"])
    assert completed["recovery_s"] == pytest.approx(1.5)  # from started_at by default
    # c, the new host, fails in turn: its promoted replica is marked failed, d's replica takes over.
    silence(registry, keys, "c")
    second = registry.ok("POST", f"/tasks/{tid}/failover", keys["d"], status=201, json={"to": "d", "expected_epoch": 2})
    assert (second["failed"], second["to_host"], second["from_epoch"], second["to_epoch"]) == ("c", "d", 2, 3)
    states = {r["participant"]: r["state"] for r in registry.ok("GET", f"/replicas?task_id={tid}")}
    assert states == {"c": "failed", "d": "promoted"}
    assert registry.call("POST", f"/failovers/{second['id']}/complete").status_code == 200  # operator
    assert [f["id"] for f in registry.ok("GET", "/failovers")] == sorted(f["id"] for f in registry.ok("GET", "/failovers"))


def test_fenced_host_cannot_sync(registry, moved):
    """A host that missed the failover writes with its old epoch and is refused."""
    keys, task, _ = moved
    tid = task["id"]
    standby = add_replica(registry, keys["a"], tid, "c", role="passive_standby")
    registry.ok("POST", f"/replicas/{standby['id']}/sync", keys["b"], json={"epoch": 1, "position": 3})
    silence(registry, keys, "b")
    registry.ok("POST", f"/tasks/{tid}/failover", keys["a"], status=201, json={"to": "a", "expected_epoch": 1})
    beat(registry, keys, "b")
    fenced = registry.call("POST", f"/replicas/{standby['id']}/sync", keys["b"], json={"epoch": 1, "position": 4})
    assert fenced.status_code == 403  # no longer the host, never the holder
    fresh = registry.call("POST", f"/replicas/{standby['id']}/sync", keys["c"], json={"epoch": 1, "position": 4})
    assert fresh.status_code == 409 and fresh.json()["epoch"] == 2 and fresh.json()["host"] == "a"
    assert registry.ok("POST", f"/replicas/{standby['id']}/sync", keys["a"], json={"epoch": 2, "position": 4})["position"] == 4


def test_a_stream_token_goes_to_the_host_and_to_holders_of_an_active_standby_replica(registry, moved):
    keys, task, _ = moved
    add_replica(registry, keys["a"], task["id"], "c")  # the contract's mode: active standby

    def token(who, purpose="stream"):
        return registry.call("POST", "/tokens", keys[who], json={"task_id": task["id"], "purpose": purpose, "audience": "a", "epoch": task["epoch"]})

    assert token("b").status_code == 201
    assert token("c").status_code == 201, "the replica reads the task's input at its origin"
    assert token("c", "handover").status_code == 409, "only the host fetches a checkpoint"
    refused = token("d")
    assert refused.status_code == 409 and "only its host" in refused.json()["detail"]


def test_an_alerts_token_goes_only_between_contract_partners_and_names_no_task(registry, moved):
    from bpm.tokens import verify

    keys, task, _ = moved

    def token(who, audience, **extra):
        return registry.call("POST", "/tokens", keys[who], json={"purpose": "alerts", "audience": audience, **extra})

    issued = token("c", "a")
    assert issued.status_code == 201
    (key,) = registry.ok("GET", "/keys")
    grant = verify(issued.json()["token"], key["public_key"], audience="a", purpose="alerts", task=None, epoch=None,
                   now=registry.clock.now.timestamp())
    assert (grant.caller, grant.task, grant.epoch) == ("c", None, None)
    refused = token("b", "c")
    assert refused.status_code == 403 and "no contract in force" in refused.json()["detail"]
    assert token("c", "a", task_id=task["id"], epoch=1).status_code == 422
    assert registry.call("POST", "/tokens", keys["b"], json={"purpose": "stream", "audience": "a"}).status_code == 422


def test_a_participant_s_view_holds_each_task_s_newest_failover_what_came_after_and_what_is_open(registry, moved):
    from bpm.federation.views import current_failover
    from bpm.ha.machine import unrepaired_failover

    keys, task, _ = moved
    tid = task["id"]

    def view_matches_the_history(expected_ids):
        for name in "acd":
            view = registry.ok("GET", f"/participants/{name}/view", keys[name])
            history = registry.ok("GET", "/failovers", keys[name])
            assert [f["id"] for f in view["failovers"]] == [f["id"] for f in history if f["id"] in expected_ids], name
            # What the agent decides from its view is what it would decide from the whole history.
            for t in view["tasks"]:
                assert current_failover(t, view["failovers"]) == current_failover(t, history), name
                assert unrepaired_failover(t, view["failovers"]) == unrepaired_failover(t, history), name
            assert [f for f in view["failovers"] if f["completed_at"] is None] == [f for f in history if f["completed_at"] is None], name

    add_replica(registry, keys["a"], tid, "c")
    silence(registry, keys, "b")
    first = registry.ok("POST", f"/tasks/{tid}/failover", keys["c"], status=201, json={"to": "c", "expected_epoch": 1})
    view_matches_the_history({first["id"]})
    registry.ok("POST", f"/failovers/{first['id']}/complete", keys["c"])
    repair = add_replica(registry, keys["c"], tid, "d", repair_of=first["id"])["repair_id"]
    view_matches_the_history({first["id"], repair})
    registry.clock.advance(1.5)
    beat(registry, keys, *"abcd")
    registry.ok("POST", f"/failovers/{repair}/complete", keys["d"])
    silence(registry, keys, "c")
    second = registry.ok("POST", f"/tasks/{tid}/failover", keys["d"], status=201, json={"to": "d", "expected_epoch": 2})
    view_matches_the_history({second["id"]})
    assert len(registry.ok("GET", "/failovers", keys["a"])) == 3, "the list keeps the whole history"
