"""The HA state machine: what a participant sees in, instructions out, per role."""

from __future__ import annotations

import pytest

from bpm.ha import task_mode
from bpm.ha.machine import (
    CompleteRepair,
    DropBackup,
    DropReplica,
    Duty,
    FailOver,
    HAMachine,
    Here,
    NoFailover,
    Observed,
    PlaceReplica,
    StartDuties,
    StartStandby,
    StopDuties,
    StopStandby,
    Trim,
)


def task(id=1, origin="a", host="b", epoch=2, name="q", **extra):
    return {"id": id, "origin": origin, "host": host, "epoch": epoch, "name": name, "input_uri": "nats://127.0.0.1:4222/a/0", **extra}


def replica(id, participant, role="passive_standby", state="active", task_id=1):
    return {"id": id, "task_id": task_id, "participant": participant, "role": role, "state": state}


def seen(now=100.0, tasks=(), replicas=(), failovers=(), modes=None, status=None, partners=("c",), here=Here()):
    return Observed(now_s=now, tasks=list(tasks), replicas=list(replicas), failovers=list(failovers),
                    modes=modes or {}, status={"a": "alive", "b": "alive", "c": "alive", **(status or {})}, partners=list(partners), here=here)


def test_the_origin_fails_a_task_over_once_per_retry_interval():
    machine = HAMachine("a", retry_s=2.0)
    view = seen(tasks=[task()], replicas=[replica(7, "c")], modes={"a.q": "passive_standby"}, status={"b": "suspected"})
    assert machine.handle(view) == [FailOver(1, "a.q", "c", 2, "passive_standby", "b", "b suspected: silent past the heartbeat timeout")]
    assert machine.handle(view) == [], "asked already: not again before the retry interval"
    again = seen(now=102.5, tasks=[task()], replicas=[replica(7, "c")], modes={"a.q": "passive_standby"}, status={"b": "suspected"})
    assert [type(i) for i in machine.handle(again)] == [FailOver]
    moved = seen(now=102.6, tasks=[task(epoch=3)], modes={"a.q": "none"}, status={"b": "failed"})
    assert machine.handle(moved)[0].epoch == 3, "a new epoch is a new question"


def test_active_standby_falls_back_to_the_origin_when_its_replica_is_gone():
    machine = HAMachine("a")
    view = seen(tasks=[task()], modes={"a.q": "active_standby"}, status={"b": "failed"},
                replicas=[replica(5, "c", role="active_standby", state="failed")])
    assert machine.handle(view) == [FailOver(1, "a.q", "a", 2, "active_standby", "b", "b failed: silent past the heartbeat timeout")]


def test_no_failover_when_the_only_candidate_is_the_failed_host():
    machine = HAMachine("a")
    view = seen(tasks=[task(origin="a", host="b")], modes={"a.q": "none"}, status={"a": "suspected", "b": "failed"})
    # Only a stale view can say so (the agent counts itself alive); nobody live is left to take the task.
    out = machine.handle(view)
    assert out and isinstance(out[0], NoFailover) and "no live participant" in out[0].message


def test_replication_is_kept_repaired_and_dropped_at_the_host():
    machine = HAMachine("a")
    failovers = [{"id": 9, "task_id": 1, "kind": "failover", "to_host": "b", "completed_at": "x", "detected_at": "2026-01-01T00:00:00Z"}]
    view = seen(tasks=[task()], replicas=[replica(3, "b")], failovers=failovers, modes={"a.q": "passive_standby"})
    out = machine.handle(view)
    assert out == [DropReplica(3, "a.q", "b", "b hosts a.q now; a replica must live elsewhere"),
                   PlaceReplica(1, "a.q", "a", "passive_standby", 9)]
    repaired = failovers + [{"id": 10, "task_id": 1, "kind": "repair", "to_host": "a", "completed_at": "x", "details": {"repair_of": 9}}]
    view = seen(tasks=[task()], replicas=[replica(3, "b", state="dropped"), replica(4, "a")], failovers=repaired, modes={"a.q": "passive_standby"})
    assert machine.handle(view) == [], "replicated at a: nothing to do"


def test_a_mode_without_replicas_drops_them_once_the_task_runs_and_trims_upstream():
    machine = HAMachine("a", interval_s=5.0)
    view = seen(tasks=[task()], replicas=[replica(3, "c")], modes={"a.q": "upstream_backup"})
    assert machine.handle(view) == [DropReplica(3, "a.q", "c", "a.q keeps no replica under mode upstream_backup"), Trim("a.q", "nats://127.0.0.1:4222/a/0")]
    assert machine.handle(seen(now=103.0, tasks=[task()], modes={"a.q": "upstream_backup"})) == [], "trimmed less than 5 s ago"
    home = seen(tasks=[task(host="a")], replicas=[replica(3, "c")], modes={"a.q": "none"})
    assert machine.handle(home) == [], "back home but not running yet: the copy stays"
    running = seen(tasks=[task(host="a")], replicas=[replica(3, "c")], modes={"a.q": "none"}, here=Here(running=frozenset({"a.q"})))
    assert [type(i) for i in machine.handle(running)] == [DropReplica]


def test_the_host_runs_duties_toward_the_newest_live_backup_and_restarts_them_on_change():
    machine = HAMachine("b")
    t = task()
    replicas = [replica(3, "a"), replica(4, "c")]
    view = seen(tasks=[t], replicas=replicas, modes={"a.q": "passive_standby"}, here=Here(running=frozenset({"a.q"})))
    assert machine.handle(view) == [StartDuties("a.q", Duty("passive_standby", "c", 2), t)]
    running = Here(running=frozenset({"a.q"}), duties={"a.q": Duty("passive_standby", "c", 2)})
    assert machine.handle(seen(tasks=[t], replicas=replicas, modes={"a.q": "passive_standby"}, here=running)) == []
    c_down = seen(tasks=[t], replicas=replicas, modes={"a.q": "passive_standby"}, here=running, status={"c": "suspected"})
    assert machine.handle(c_down) == [StopDuties("a.q", release=False), StartDuties("a.q", Duty("passive_standby", "a", 2), t)]
    gone = seen(tasks=[task(host="c", epoch=3)], modes={"a.q": "passive_standby"}, here=running)
    assert machine.handle(gone) == [StopDuties("a.q", release=True)]
    no_backup = seen(tasks=[t], modes={"a.q": "passive_standby"}, here=Here(running=frozenset({"a.q"})))
    assert machine.handle(no_backup) == [], "no backup yet: the origin places one first"


def test_a_holder_runs_its_standby_drops_stale_copies_and_completes_its_repair():
    machine = HAMachine("c")
    t = task()
    repair = {"id": 11, "task_id": 1, "kind": "repair", "to_host": "c", "completed_at": None,
              "detected_at": "1970-01-01T00:01:30Z", "details": {"replica_id": 4}}
    view = seen(tasks=[t], replicas=[replica(4, "c", role="active_standby")], failovers=[repair], modes={"a.q": "active_standby"})
    assert machine.handle(view) == [StartStandby("a.q", 4, t)]
    running = Here(standby={"a.q": 4})
    assert machine.handle(seen(tasks=[t], replicas=[replica(4, "c", role="active_standby")], failovers=[repair],
                               modes={"a.q": "active_standby"}, here=running)) == [CompleteRepair(11, "a.q", 10.0)]
    dropped = seen(tasks=[t], replicas=[replica(4, "c", role="active_standby", state="dropped")], here=Here(standby={"a.q": 4}, backups={"a.q": True}))
    assert machine.handle(dropped) == [StopStandby("a.q", "its replica is no longer active here"), DropBackup("a.q")]
    promoted = seen(tasks=[t], replicas=[replica(4, "c", role="active_standby", state="promoted")], here=Here(standby={"a.q": 4}))
    assert machine.handle(promoted) == [], "a promoted replica waits for its takeover"


def test_participants_not_concerned_do_nothing():
    machine = HAMachine("z")
    view = seen(tasks=[task()], replicas=[replica(3, "c")], modes={"a.q": "passive_standby"}, status={"b": "failed"})
    assert machine.handle(view) == []


@pytest.mark.parametrize(
    ("own", "kw", "expected"),
    [
        ("none", {}, "none"),
        ("none", {"movement_state": "active", "contract_mode": "passive_standby"}, "passive_standby"),
        ("none", {"movement_state": "failed", "contract_mode": "passive_standby"}, "passive_standby"),
        ("none", {"movement_state": "ended", "contract_mode": "passive_standby"}, "none"),
        ("none", {"movement_state": "ended", "contract_mode": "passive_standby", "ended_too": True}, "passive_standby"),
        ("upstream_backup", {"movement_state": "active", "contract_mode": "active_standby"}, "upstream_backup"),
        ("none", {"movement_state": "ended", "failover_mode": "active_standby"}, "active_standby"),
    ],
)
def test_task_mode_is_one_rule(own, kw, expected):
    assert task_mode(own, **kw) == expected


def test_a_task_that_moves_on_from_the_holder_that_took_it_over_is_replicated_there_again():
    """The origin took its task over from its own copy (its replica promoted), then moved it
    to a partner again: the promoted record goes, and the origin holds a new copy; while the
    task still runs at the holder that took it over, the record stays."""
    machine = HAMachine("a")
    failovers = [{"id": 9, "task_id": 1, "kind": "failover", "to_host": "a", "completed_at": "x", "detected_at": "2026-01-01T00:00:00Z"},
                 {"id": 10, "task_id": 1, "kind": "repair", "to_host": "b", "completed_at": "x", "details": {"repair_of": 9}}]
    moved_again = seen(tasks=[task(host="b", epoch=3)], replicas=[replica(1, "a", state="promoted"), replica(3, "b")], failovers=failovers,
                       modes={"a.q": "passive_standby"})
    out = machine.handle(moved_again)
    assert DropReplica(1, "a.q", "a", "a took a.q over and it has moved on since") in out, out
    assert DropReplica(3, "a.q", "b", "b hosts a.q now; a replica must live elsewhere") in out, out
    assert [i.at for i in out if isinstance(i, PlaceReplica)] == ["a"], out
    at_home = seen(tasks=[task(host="a", epoch=2)], replicas=[replica(1, "a", state="promoted"), replica(3, "b")], failovers=failovers,
                   modes={"a.q": "passive_standby"})
    assert not [i for i in HAMachine("a").handle(at_home) if isinstance(i, DropReplica)], "it still runs where it was taken over"
