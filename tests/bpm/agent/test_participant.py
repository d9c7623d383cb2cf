"""A participant's one front door: the mechanism's events and HA's observations through one
`handle`, one journal of both, replayed."""

from __future__ import annotations

import pytest

from bpm.agent.machine import Contracts, Gather, Mechanism, Tick, Wait
from bpm.agent.participant import ParticipantMachine, replay
from bpm.ha.machine import FailOver, HAMachine, Here, Observed


def failed_host(now: float) -> Observed:
    """a's task q hosted at b, which the registry counts failed; c holds a passive copy."""
    task = {"id": 1, "origin": "a", "host": "b", "epoch": 2, "name": "q", "input_uri": ""}
    replica = {"id": 7, "task_id": 1, "participant": "c", "role": "passive_standby", "state": "active"}
    return Observed(now_s=now, tasks=(task,), replicas=(replica,), failovers=(), modes={"a.q": "passive_standby"},
                    status={"a": "alive", "b": "failed", "c": "alive"}, partners=("c",), here=Here())


def test_each_event_reaches_the_machine_that_decides_on_it():
    machine = ParticipantMachine.named("a", ha_interval_s=1.0, period_s=1.0)
    assert machine.name == "a" and machine.ha.interval_s == 1.0 and machine.mechanism.period_s == 1.0
    assert machine.handle(Tick(0.0)) == [Contracts(), Gather()], "a period is due: the mechanism asks for what it sees"
    assert machine.handle(failed_host(0.5)) == [FailOver(1, "a.q", "c", 2, "passive_standby", "b", "b failed: silent past the heartbeat timeout")]
    assert machine.ha.asked == {1: (2, 0.5)} and machine.mechanism.next_period_s == 1.0, "each part keeps its own state"


def test_one_journal_replays_both_kinds_of_decision_only_whole_and_only_with_the_mechanism_s_settings_changed():
    machine = ParticipantMachine(Mechanism("a", period_s=1.0), HAMachine("a", retry_s=2.0), journal_length=4)
    events = [Tick(0.0), failed_host(0.5), failed_host(1.0), Tick(1.0)]
    for event in events:
        machine.handle(event)
    journal = machine.journal
    assert [event for event, _ in journal.entries] == [events[0], events[1], events[3]] and journal.dropped == 0, \
        "the failover is asked once per retry interval; the observation that asked for nothing changed nothing, and is not kept"
    assert [len(out) for _, out in journal.entries] == [2, 1, 2]
    assert replay(journal) is None

    held = replay(journal, warmup_s=10.0)  # still warming up: the first period would have waited
    assert held is not None and held.index == 0 and held.journaled == (Contracts(), Gather())
    assert [i.cause for i in held.replayed if isinstance(i, Wait)] == ["warming_up"]

    for name in ("journal_length", "name", "speed"):
        with pytest.raises(ValueError, match="not a setting"):
            replay(journal, **{name: 2.0})
    machine.handle(Tick(2.0))
    machine.handle(failed_host(3.0))  # asked again, past the retry interval
    assert (len(journal.entries), journal.dropped) == (4, 1)
    with pytest.raises(ValueError, match="dropped its first 1"):
        replay(journal)
    assert ParticipantMachine.named("b").journal is None, "no journal unless asked for"


def test_a_replay_starts_from_the_machine_as_it_was_before_its_first_event():
    machine = ParticipantMachine.named("a", journal_length=10, period_s=1.0)
    machine.ha.asked[1] = (2, 0.0)  # it had asked for q's failover before the journal began
    assert machine.handle(failed_host(2.5)) and replay(machine.journal) is None, "past the retry interval: asked again, in the replay too"
    machine.journal.start.ha.asked[1] = (2, 1.0)
    diverged = replay(machine.journal)
    assert diverged is not None and diverged.replayed == (), "had it asked later, the replay would not ask again yet"
