"""The agent's control loop, stepped in one process against the real registry app.

The Spark side is replaced by a host that runs nothing but keeps a checkpoint file per
task and reports fixed loads, so that what is tested here is the loop: reconciliation,
checkpoint handover, offers, answers, ends, heartbeats and the records they leave.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bpm.costs import MM1Cost
from bpm.negotiation import is_acceptable
from spark_agents.agent import OwnTask
from spark_agents.handover import HandoverNotReady
from tests.spark_agents.stepped import stepped_federation

TASK_LOAD = 0.12


class SteppedHost:
    """Runs no Spark: each started task bumps a counter in its checkpoint, like batches would."""

    def __init__(self, cost: MM1Cost) -> None:
        self._running: dict[str, Path] = {}
        self.cost = cost
        self.starts: list[tuple[str, int]] = []
        self.task_load: dict[str, float] = {}
        self.output_ends: dict[str, int | None] = {}  # end_output's calls, the last per task

    def start_task(self, task_id, source, checkpoint_dir, params, epoch, query=None):
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = checkpoint_dir / "batches"
        count = int(state.read_text()) if state.exists() else 0
        state.write_text(str(count + 1))
        self.starts.append((task_id, count))
        self._running[task_id] = checkpoint_dir

    def stop_task(self, task_id):
        return self._running.pop(task_id)

    def end_output(self, task_id, until_s):
        self.output_ends[task_id] = until_s

    def running(self):
        return set(self._running)

    def starting(self):
        return set()

    def loads(self):
        return {key: self.task_load.get(key, TASK_LOAD) for key in self._running}

    def rising(self):
        return set()

    def cost_function(self):
        return self.cost

    def status(self):
        return {"tasks": sorted(self._running)}


@pytest.fixture
def federation(tmp_path):
    # Threshold of a*u/(1-u) at price 1 with a = 0.25: u = 1 - sqrt(0.25) = 0.5.
    with stepped_federation(tmp_path, lambda now: SteppedHost(MM1Cost(a=0.25, c=1.0))) as federation:
        yield federation


def _contract(agents, a, b, price=1.0, duration=30.0):
    proposed = agents[a].client.propose(b, price, price * 1.1, duration)
    agents[b].client.contract_action(proposed["id"], "accept")


def _round(agents, clock, seconds=1.0):
    for agent in agents.values():
        agent.tick()
    clock.advance(seconds)


def shed_to_b_and_c(federation, tasks: int, rounds: int = 12) -> None:
    """a with `tasks` tasks, b and c with one each, a's contracts with both; `rounds` rounds."""
    operator, agents, add, clock = federation
    add("a", tasks)
    add("b", 1)
    add("c", 1)
    _contract(agents, "a", "b")
    _contract(agents, "a", "c")
    for _ in range(rounds):
        _round(agents, clock)


def test_overloaded_participant_sheds_until_acceptable(federation):
    operator, agents, add, clock = federation
    shed_to_b_and_c(federation, 9)  # 1.08 load against a 0.5 threshold: more than one partner can absorb
    loads = {p["name"]: p["load"] for p in operator.participants()}
    thresholds = {p["name"]: p["threshold"] for p in operator.participants()}
    assert loads["a"] < 9 * TASK_LOAD, "load moved away from the overloaded participant"
    assert loads["b"] > TASK_LOAD and loads["c"] > TASK_LOAD, "both partners took load"
    assert is_acceptable(list(loads.values()), list(thresholds.values())), (loads, thresholds)
    # Every moved task resumed from the checkpoint its origin released, never from scratch.
    for name in ("b", "c"):
        moved = [(key, count) for key, count in agents[name].host.starts if key.startswith("a.")]
        assert moved and all(count == 1 for _, count in moved), moved
    ledger = operator.ledger()
    assert sum(b["balance"] for b in ledger["balances"]) == pytest.approx(0.0)
    assert {b["participant"]: b["balance"] < 0 for b in ledger["balances"]}["a"]
    kinds = {e["kind"] for e in operator.events(limit=500)}
    assert {"offer.made", "offer.accepted", "task.received"} <= kinds


def test_an_offer_left_to_expire_by_a_settling_partner_sends_the_next_to_the_other_partner(federation):
    """b settles after changes of its own and answers nothing: a's offer expires, and a turns to
    c, as after a refusal, instead of offering to b, its cheapest partner, again."""
    operator, agents, add, clock = federation
    a, b = add("a", 9), add("b", 1)
    add("c", 1)
    _contract(agents, "a", "b")
    _contract(agents, "a", "c")
    b.machine.mechanism.settle_s, b.machine.mechanism.changed_s = 1e6, clock.now.timestamp()  # b's tasks keep changing
    for _ in range(3 + int(a.config.offer_ttl_s)):
        _round(agents, clock)
    offers = sorted(operator.offers(), key=lambda o: o["id"])
    assert [(o["to"], o["state"]) for o in offers[:2]] == [("b", "expired"), ("c", "accepted")], offers
    assert a.machine.mechanism.unanswered and set(a.machine.mechanism.unanswered) == {"b"} and a.machine.mechanism.refused_splits == 0
    assert [r.message for r in a.records if r.kind == "offer.expired"] == [
        f"my offer #{offers[0]['id']} to b expired unanswered: my next offers try my other partners first, until b answers one"]


def test_movement_ends_and_task_returns_with_its_checkpoint(federation):
    operator, agents, add, clock = federation
    add("a", 6)
    add("b", 0)
    _contract(agents, "a", "b", duration=5.0)
    for _ in range(4):
        _round(agents, clock)
    moved = operator.movements(state="active")
    assert moved, "a shed load to b"
    # The input of a's tasks at home dries up: their load falls and ending now pays for the origin.
    for key in agents["a"].host.running():
        agents["a"].host.task_load[key] = 0.01
    for _ in range(8):
        _round(agents, clock)
    ended = operator.movements(state="ended")
    assert ended, "the origin took its tasks back once hosting them was cheaper than paying"
    back = [(k, c) for k, c in agents["a"].host.starts if k == f"a.{ended[0]['task_name']}"]
    assert back[-1][1] == 2, "the task came back with the partner's checkpoint (started twice before)"


def test_a_task_not_measured_yet_counts_with_the_load_its_previous_host_reported(federation):
    operator, agents, add, clock = federation
    a = add("a", 6)
    b = add("b", 0)
    a.host.task_load = {key: 0.2 for key in (f"a.p{i}" for i in range(6))}
    b.host.loads = lambda: {}  # b has not measured the tasks it received yet (start-up, spark_agents.runtime)
    _contract(agents, "a", "b", duration=600.0)
    for _ in range(4):
        _round(agents, clock)
    moved = b.host.running()
    assert moved, "a shed load to b"
    reported = {p["name"]: p["load"] for p in operator.participants()}
    assert reported["b"] == pytest.approx(0.2 * len(moved)), "b counts each task with what a measured"
    assert [t["load"] for t in operator.tasks(host="b")] == pytest.approx([0.2] * len(moved))


def test_a_task_not_measured_here_yet_counts_in_the_load_but_is_not_offered(federation):
    """A host counts a task that has just arrived with what its previous host measured, but
    offers it only once it has measured it itself."""
    operator, agents, add, clock = federation
    add("a", 6)
    b = add("b", 1)
    add("c", 0)
    _contract(agents, "a", "b", duration=600.0)
    _contract(agents, "b", "c", duration=600.0)
    for _ in range(4):
        _round(agents, clock)
    hosted = {k for k in b.host.running() if k.startswith("a.")}
    assert hosted, "a shed load to b"
    seen = b._view()
    assert {t.origin for t in seen.offerable} == {"a", "b"}, "measured here: b's own task and a's may go on"
    own = {k for k in b.host.running() if k.startswith("b.")}
    b.host.loads = lambda: {key: TASK_LOAD for key in own}  # b has not measured a's tasks yet (start-up)
    view = b._view()
    assert view.load == pytest.approx(seen.load), "a's tasks count with what a measured"
    assert {t.origin for t in view.offerable} == {"b"}, "only the task b measured may be offered"


def _b_passes_on(federation, a_b_duration: float):
    """a sheds to b; the tasks grow at b, over its threshold with only a's tasks, which it
    cannot return before the a-b contract's minimum duration: b passes them on to c."""
    operator, agents, add, clock = federation
    a, b, c = add("a", 6), add("b", 0), add("c", 0)
    _contract(agents, "a", "b", duration=a_b_duration)
    _contract(agents, "b", "c", duration=600.0)
    for _ in range(4):
        _round(agents, clock)
    at_b = sorted(b.host.running())
    assert at_b and all(k.startswith("a.") for k in at_b), "a shed load to b"
    b.host.task_load = dict.fromkeys(at_b, 0.4)
    for _ in range(6):
        _round(agents, clock)
    return a, b, c


def test_a_host_over_its_threshold_passes_hosted_tasks_on_and_the_origin_gets_them_back_from_the_last_host(federation):
    operator, agents, add, clock = federation
    a, b, c = _b_passes_on(federation, a_b_duration=600.0)
    onward = [m for m in operator.movements(state="active") if m["from"] == "b"]
    assert onward and all(m["to"] == "c" and m["origin"] == "a" for m in onward), operator.movements()
    passed = f"a.{onward[0]['task_name']}"
    assert passed in c.host.running() and passed not in b.host.running()
    assert [n for k, n in c.host.starts if k == passed] == [2], "c resumed from b's checkpoint (a ran it, then b)"
    # a takes the task back: the chain unwinds and the checkpoint comes from c, where it ran last.
    clock.advance(600)
    first = next(m for m in operator.movements(state="active") if m["from"] == "a" and m["task_id"] == onward[0]["task_id"])
    a.client.end_movement(first["id"])
    assert {m["id"]: m["state"] for m in operator.movements()}[onward[0]["id"]] == "ended"
    a.tick()
    assert passed in a.host.running() and passed not in c.host.running()
    assert [n for k, n in a.host.starts if k == passed] == [0, 3], "a resumed from c's checkpoint, not b's older one"
    ledger = operator.ledger()
    assert sum(x["balance"] for x in ledger["balances"]) == pytest.approx(0.0)


def _cut_after_release(agent):
    """`agent`'s next fetches reach the old host, which stops the task and packs its
    checkpoint, but the answer never arrives (the old host, or the caller, is killed then)."""
    real = agent.fetch

    def cut(endpoint, key, epoch, token):
        real(endpoint, key, epoch, token)
        raise HandoverNotReady("the connection broke")

    agent.fetch = cut


def test_a_host_killed_after_stopping_a_passed_on_task_hands_it_over_once_restarted(federation):
    """c stops a's task for a (the chain unwinds) and is SIGKILLed before a has the
    checkpoint: the restarted c, which never heard of the task, finds it in the registry."""
    operator, agents, add, clock = federation
    a, b, c = _b_passes_on(federation, a_b_duration=600.0)
    onward = [m for m in operator.movements(state="active") if m["from"] == "b"]
    passed = f"a.{onward[0]['task_name']}"
    clock.advance(600)
    first = next(m for m in operator.movements(state="active") if m["from"] == "a" and m["task_id"] == onward[0]["task_id"])
    a.client.end_movement(first["id"])
    _cut_after_release(a)
    a.tick()
    assert passed not in a.host.running() and passed not in c.host.running(), "stopped at c, not started at a"
    restarted = add("c", 0)
    assert passed not in restarted._task_ids
    a.fetch = agents["b"].fetch  # the federation's usual fetch
    a.tick()
    assert passed in a.host.running()
    assert [n for k, n in a.host.starts if k == passed] == [0, 3], "a resumed from c's checkpoint"


def test_agents_killed_mid_handover_start_the_task_once_after_restarting(federation):
    """a's tasks, added at run time, move to b; a stops them and packs their checkpoints, then
    both agents are SIGKILLed. Restarted, with nothing in memory, they finish the handover:
    every task runs once, at b, from a's checkpoint."""
    operator, agents, add, clock = federation
    add("a", 0)
    for i in range(6):
        agents["a"].add_task(OwnTask(f"q{i}", "", {}))
    add("b", 0)
    _contract(agents, "a", "b")
    _cut_after_release(agents["b"])
    for _ in range(4):
        _round(agents, clock)
    moved = {f"a.{m['task_name']}" for m in operator.movements(state="active")}
    assert moved and not moved & (agents["a"].host.running() | agents["b"].host.running()), "stopped at a, not started at b"
    add("a", 0)
    add("b", 0)
    for _ in range(3):
        _round(agents, clock)
    assert moved <= agents["b"].host.running() and not moved & agents["a"].host.running()
    assert [n for k, n in agents["b"].host.starts if k in moved] == [1] * len(moved), "each resumed from a's checkpoint, once"
    hosts = {f"a.{t['name']}": t["host"] for t in operator.tasks(origin="a")}
    assert all(hosts[k] == "b" for k in moved)


def test_a_host_ends_only_the_movements_of_tasks_that_still_run_there(federation):
    operator, agents, add, clock = federation
    _, b, _ = _b_passes_on(federation, a_b_duration=30.0)
    passed = {m["task_id"] for m in operator.movements(state="active") if m["from"] == "b"}
    kept = b.host.running()
    assert passed and kept, "b passed some of a's tasks on to c and kept others"
    # Past the a-b contract's minimum duration the task b kept grows: b returns it to a, and
    # leaves alone the movements that brought it the tasks it passed on (the registry would
    # refuse to end those: their tasks run at c).
    clock.advance(30)
    b.host.task_load = dict.fromkeys(kept, 0.85)
    for _ in range(3):
        b.tick()
        clock.advance(1)
    ended = operator.movements(state="ended")
    returned = {t["id"] for t in operator.tasks(origin="a") if f"a.{t['name']}" in kept}
    assert {m["task_id"] for m in ended} == returned, ended
    assert not [r for r in b.records if r.kind == "movement.end_refused"], [r.message for r in b.records]
    assert all(m["state"] == "active" for m in operator.movements() if m["task_id"] in passed)


def test_a_failed_step_is_recorded_and_the_loop_goes_on(federation):
    operator, agents, add, clock = federation
    a = add("a", 1)

    def broken():
        raise RuntimeError("spark is gone")

    a.host.loads = broken
    a.tick()
    a.tick()
    assert a.errors >= 2 and a.steps == 2
    reported = [e for e in operator.events(kind="agent.error") if e["actor"] == "a"]
    assert reported and "spark is gone" in reported[0]["message"]


def test_contracts_agreed_offline_become_active_once_both_sides_run(federation):
    from bpm.federation.views import AgreedTerms

    operator, agents, add, clock = federation
    a = add("a", 1)
    a.config.contracts = [AgreedTerms("b", 1.0, 1.1, 15.0), AgreedTerms("c", 2.0, 2.2, 15.0)]
    _round(agents, clock)
    assert operator.contracts() == [], "nothing to sign while the partners have not joined"
    b = add("b", 1)
    b.config.contracts = [AgreedTerms("a", 1.0, 1.1, 15.0)]
    c = add("c", 1)
    c.config.contracts = [AgreedTerms("a", 2.0, 2.5, 15.0)]  # c agreed other terms: left for a person
    for _ in range(3):
        _round(agents, clock)
    states = {(k["proposer"], k["counterparty"]): k["state"] for k in operator.contracts()}
    assert states == {("a", "b"): "active", ("a", "c"): "proposed"}
    kinds = [r.kind for r in a.records] + [r.kind for r in b.records]
    assert kinds.count("contract.proposed") == 2 and kinds.count("contract.accepted") == 1


def test_no_load_is_traded_while_the_agent_warms_up(federation):
    operator, agents, add, clock = federation
    a = add("a", 9)
    a.machine.mechanism.warmup_s = 10.0  # the state machine decides when trading starts
    add("b", 1)
    _contract(agents, "a", "b")
    for _ in range(5):
        _round(agents, clock)
    assert operator.offers() == [], "no offer in the first 10 s"
    waits = [r.message for r in a.records if r.kind == "offer.none"]
    assert len(waits) == 1 and waits[0].startswith("warming up"), "the decision not taken is recorded once, with its cause"
    for _ in range(8):
        _round(agents, clock)
    assert operator.offers(), "offers once warm"
    b_waits = [r.message for r in agents["b"].records if r.kind == "offer.none"]
    assert any("below every contract's lowest price" in m for m in b_waits), b_waits


def test_trading_waits_for_a_load_window_that_saw_only_the_current_tasks(federation):
    operator, agents, add, clock = federation
    a = add("a", 9)  # 1.08 load against a 0.5 threshold
    b = add("b", 1)
    for agent in (a, b):
        agent.machine.mechanism.settle_s = 10.0
    _contract(agents, "a", "b")
    for _ in range(9):
        _round(agents, clock)
    assert operator.offers() == [], "the tasks that just started are not measured yet: no offer within 10 s"
    for _ in range(3):
        _round(agents, clock)
    assert operator.movements(), "a shed load once its window saw only the tasks it runs"
    made = len(operator.offers())
    for _ in range(8):
        _round(agents, clock)
    assert len(operator.offers()) == made, "no new offer while a's load window still holds the tasks that left"
    for _ in range(4):
        _round(agents, clock)
    assert len(operator.offers()) > made, "a, still over its threshold, offers again once settled"


def test_a_stop_that_waits_long_for_its_batch_holds_up_no_tick(federation):
    """A task that left stops in the background once its batch takes longer than the sync
    waits (`STOP_WAIT_S`): the loop ticks on (heartbeats, HA's detection, the mechanism), no
    second stop of it begins, its new host waits for its checkpoint, and resumes from it once
    the stop has ended."""
    import threading

    operator, agents, add, clock = federation
    a, b = add("a", 9), add("b", 1)
    _contract(agents, "a", "b")
    boundary = threading.Event()
    stops: list[str] = []
    stop = a.host.stop_task

    def slow_stop(key):
        # As Spark's: the query ends at once, the stop returns once its batch is over.
        stops.append(key)
        checkpoint = stop(key)
        # A bound against a hang, not a speed: the boundary comes after some fifty rounds,
        # which on a busy machine take longer than a batch would.
        assert boundary.wait(300), "the test's batch boundary never came"
        return checkpoint

    a.host.stop_task = slow_stop
    for _ in range(12):
        _round(agents, clock)
    assert stops, "a let no task go"
    waiting = set(stops)
    assert waiting <= a._stopping, "a's stops have not returned"
    assert len(stops) == len(waiting), f"a second stop of one task began: {stops}"
    assert a.steps >= 12 and not a.errors
    beats = operator.participant("a")["heartbeat_at"]
    _round(agents, clock)
    assert operator.participant("a")["heartbeat_at"] != beats, "a's loop sent its heartbeat while its stops waited"
    assert not any(key in b.hosting() for key in waiting), "no new host started a task before its old host released it"
    # One of them comes home while its stop has not returned: a starts it only once it has.
    home = sorted(waiting)[0]
    movement = next(m for m in operator.movements(state="active") if f"a.{m['task_name']}" == home)
    for _ in range(31):  # past the contract's shortest duration
        _round(agents, clock)
    a.client.end_movement(movement["id"])
    starts = len(a.host.starts)
    for _ in range(3):
        _round(agents, clock)
    assert home not in a.hosting() and len(a.host.starts) == starts, "a started a task again before its stop returned"

    boundary.set()
    for _ in range(200):
        if not waiting & a._stopping:
            break
        threading.Event().wait(0.05)
    for _ in range(4):
        _round(agents, clock)
    assert home in a.hosting() and len(a.host.starts) > starts, "a runs the task that came home once its stop returned"
    moved = [(key, count) for key, count in b.host.starts if key in waiting - {home}]
    assert moved and all(count >= 1 for _, count in moved), f"b resumed what it took from a's checkpoints: {moved}"


def test_tasks_that_left_stop_together_each_at_its_own_batch_boundary(federation):
    """A participant that lets several tasks go stops them all at once: each stop waits for
    its own batch boundary (here, for every other stop to have begun), not for the others'
    to end one after another."""
    import threading

    operator, agents, add, clock = federation
    a = add("a", 3)
    _round(agents, clock)
    keys = sorted(a.hosting())
    assert len(keys) == 3, keys
    together = threading.Barrier(len(keys), timeout=10)
    stop = a.host.stop_task

    def stop_at_boundary(key):
        together.wait()  # broken, and raising, unless every stop is under way at once
        return stop(key)

    a.host.stop_task = stop_at_boundary
    a.release_all([(key, 1) for key in keys])
    assert not a.hosting()
    assert {key: a._released[key] for key in keys} == {key: 1 for key in keys}


def test_an_agent_whose_host_carries_out_no_ha_role_says_it_runs_without_ha(federation):
    """HA on (the default) with a host that has no `ha_*` methods: the agent runs without
    HA, and says so, instead of turning it off unseen."""
    from spark_agents.agent import HATaskHost

    _, agents, add, _ = federation
    add("a", 1)
    assert not isinstance(SteppedHost(MM1Cost(a=0.25, c=1.0)), HATaskHost)
    assert agents["a"].config.ha and agents["a"].ha is None
    assert [r.message for r in agents["a"].records if r.kind == "agent.ha_off"] == [
        "a: no high availability: its task host (SteppedHost) carries out no HA role"]


def test_an_agent_s_decisions_replay_from_its_state_machine_s_journal(federation):
    """What a live agent decided follows from the events its state machine was given alone:
    replayed into a copy of the machine as it started, they give the same instructions; with
    another setting (a warm-up that had not ended), the first decision that differs shows."""
    from bpm.agent.machine import Gather, MakeOffer, Wait
    from bpm.agent.participant import replay

    _, agents, _, _ = federation
    shed_to_b_and_c(federation, 9)
    journal = agents["a"].machine.journal
    made = [i for _, out in journal.entries for i in out if isinstance(i, MakeOffer)]
    assert made and journal.dropped == 0
    assert replay(journal) is None
    held = replay(journal, warmup_s=1e6)  # the first period it gathered for, it would have waited
    assert held is not None and Gather() in held.journaled
    assert [i.cause for i in held.replayed if isinstance(i, Wait)] == ["warming_up"]
