"""What follows a split or merge of a participant's own tasks: decided from what it read alone."""

from __future__ import annotations

from bpm.agent.participant import ParticipantMachine, replay
from bpm.agent.regrain import OwnTasksRead, RegisterMissing, Restart, Retire, missing_halves, regrain
from bpm.keygroups import BITS

STREAM = "nats://127.0.0.1:4222/a/main"


def record(id, prefix, *, origin="a", host="a", until_s=None, from_tasks=None, epoch=1, retired=False, name=None):
    return {"id": id, "name": name or f"g{prefix}", "origin": origin, "host": host, "epoch": epoch, "input_uri": f"{STREAM}/{prefix}",
            "until_s": until_s, "from_tasks": from_tasks, "retired": retired}


OLD = record(6, "0", until_s=1000, epoch=3)  # a's task over key groups 0..., split at 1000
HALVES = (record(7, "00", from_tasks=[6]), record(8, "01", from_tasks=[6]))


def test_a_split_task_restarts_over_its_ended_input_then_retires():
    running = frozenset({"a.g0"})
    assert regrain("a", OwnTasksRead((OLD, *HALVES), running, {"a.g0": None})) == [Restart("a.g0", 3, 1000)], \
        "its running query reads on past the split: restart it over the input that ends at 1000"
    assert regrain("a", OwnTasksRead((OLD, *HALVES), running, {})) == [Restart("a.g0", 3, 1000)], "nor is its end known"
    assert regrain("a", OwnTasksRead((OLD, *HALVES), running, {"a.g0": 1000})) == [Retire(OLD, 1000)], "it runs to 1000: retire it once out"


def test_the_half_of_a_split_not_registered_yet_is_registered_first():
    read = OwnTasksRead((OLD, HALVES[0]), frozenset({"a.g0"}), {"a.g0": 1000})
    assert regrain("a", read) == [RegisterMissing(OLD, ("01",)), Retire(OLD, 1000)]
    assert missing_halves(OLD, [OLD]) == ("00", "01"), "an agent that stopped before either registration"
    merged = record(9, "0", from_tasks=[7, 8])
    assert missing_halves({**HALVES[0], "until_s": 1000}, [merged, *HALVES]) == (), "a merge's successor covers both: nothing is missing"
    one = record(10, "0" * BITS, until_s=1000)
    assert missing_halves(one, [one]) == () and missing_halves({**OLD, "input_uri": "file:///data"}, [OLD]) == (), \
        "a task over one key group, or over no broker stream, never split: nothing is missing (nor an error)"


def test_only_my_own_tasks_that_ended_and_run_at_home_are_acted_on():
    running = frozenset({"a.g0", "a.g00", "b.g0"})
    for task in (record(6, "0"),                              # not ended
                 record(6, "0", until_s=1000, host="b"),      # moved away
                 record(6, "0", until_s=1000, origin="b"),    # another's
                 record(6, "0", until_s=1000, retired=True),  # retired already
                 record(6, "1", until_s=1000)):               # not running here
        assert regrain("a", OwnTasksRead((task, *HALVES), running)) == [], task


def test_the_participant_machine_routes_what_it_read_to_these_rules_and_journals_it():
    machine = ParticipantMachine.named("a", journal_length=10)
    read = OwnTasksRead((OLD, *HALVES), frozenset({"a.g0"}), {"a.g0": None})
    assert machine.handle(read) == [Restart("a.g0", 3, 1000)]
    assert machine.journal.entries[0] == (read, (Restart("a.g0", 3, 1000),)) and replay(machine.journal) is None
    assert machine.handle(OwnTasksRead((record(6, "0"),), frozenset({"a.g0"}))) == [] and len(machine.journal.entries) == 1, \
        "a read that calls for nothing changes nothing: not kept"
