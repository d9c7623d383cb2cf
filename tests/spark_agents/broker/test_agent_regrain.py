"""The live agent's state machine asks for a split where lumpy load blocks a shed, and the
agent carries it out through the registry; the half it then sheds moves to a partner.
Stepped, without Spark (`test_agent_split.py` runs a split on Spark)."""

from __future__ import annotations

import pytest

from bpm.costs import MM1Cost
from bpm.federation.views import regrains
from bpm.keygroups import BITS, MAIN, check_prefix
from bpm.zeek.definitions import MICROS
from spark_agents.broker.stream import BrokerStream
from spark_agents.streams.feed import write_end
from bpm.records import Records
from examples.network_monitoring import query as MONITORING
from tests.spark_agents.broker.test_agent_broker import own_brokers  # noqa: F401 - the fixture
from tests.spark_agents.stepped import stepped_federation
from tests.spark_agents.test_agent import SteppedHost, _round, shed_to_b_and_c

pytestmark = pytest.mark.slow

FIXED_COST = 0.01
# a's four tasks: 0.52 against a threshold of 0.5 at price 1, each too large for its saving to beat the price.
SHARES = {"00": 0.14, "01": 0.13, "10": 0.125, "11": 0.125}


class _KeyGroupsHost(SteppedHost):
    """A task's load follows its key groups: a half of a share carries half its load plus
    the fixed cost; a task whose input ended carries only the fixed cost."""

    def __init__(self, cost) -> None:
        super().__init__(cost)
        self.sources = {}

    def start_task(self, task_id, source, checkpoint_dir, params, epoch, query=None):
        super().start_task(task_id, source, checkpoint_dir, params, epoch)
        self.sources[task_id] = source

    def loads(self):
        out = {}
        for key in self._running:
            source = self.sources.get(key)
            if source is None or not source.participant == "a":
                out[key] = 0.12
            elif source.until_s is not None:
                out[key] = FIXED_COST
            else:
                prefix = check_prefix(source.prefix)
                out[key] = SHARES[prefix[:2]] / 2 ** (len(prefix) - 2) + (FIXED_COST if len(prefix) > 2 else 0.0)
        return out


def test_an_agent_splits_a_task_too_large_to_move_and_sheds_a_half(tmp_path, own_brokers):
    with stepped_federation(tmp_path, lambda now: _KeyGroupsHost(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers,
                            fixed_cost={"a": FIXED_COST}) as federation:
        operator, agents, add, _ = federation
        shed_to_b_and_c(federation, len(SHARES))
        a = agents["a"]
        tasks = {t["name"]: t for t in operator.tasks(origin="a")}
        made = [t for t in tasks.values() if t["from_tasks"]]
        assert a.counts["splits"] >= 1 and made, [(t["name"], t["host"]) for t in tasks.values()]
        parent = next(t for t in tasks.values() if t["id"] == made[0]["from_tasks"][0])
        assert parent["name"] in ("g10", "g11") and parent["until_s"] is not None and parent["host"] == "a"
        assert all(t["since_s"] == parent["until_s"] for t in made if t["from_tasks"] == [parent["id"]])
        assert parent["query"] == "network-monitoring" and all(
            (t["query"], t["query_digest"]) == (parent["query"], parent["query_digest"]) for t in made), "a split runs its parent's query"
        assert a.host.output_ends[f"a.{parent['name']}"] == parent["until_s"], \
            "the old task's running query writes no window from the split time on, from the split on"
        assert a.host.sources[f"a.{parent['name']}"].until_s == parent["until_s"], "the split task runs on over its ended input"
        assert any(t["host"] in ("b", "c") for t in made), "a half of the split task was shed to a partner"
        assert "task.split" in [e["kind"] for e in operator.events()]
        # As the demo's view and timeline tell it, from the registry's listing.
        assert {"kind": "split", "origin": "a", "from": [parent["name"]], "made": sorted(t["name"] for t in made if t["from_tasks"] == [parent["id"]]),
                "ids": sorted(t["id"] for t in made if t["from_tasks"] == [parent["id"]])} in regrains(operator.tasks())

        # Restarted (a new process, a new host), a resumes the split task over its ended input.
        a = add("a", len(SHARES))
        a.sync()
        assert a.host.sources[f"a.{parent['name']}"].until_s == parent["until_s"]
        assert {f"a.{t['name']}" for t in made if t["host"] == "a"} <= a.host.running()


def test_a_split_task_whose_stop_waits_long_for_its_batch_restarts_once_it_has_stopped(tmp_path, own_brokers):
    """The restart of a split task stops it as a task that leaves stops: in the background, the
    loop ticking on; the sync starts it again over its ended input only once the stop returned."""
    import threading

    with stepped_federation(tmp_path, lambda now: _KeyGroupsHost(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers,
                            fixed_cost={"a": FIXED_COST}) as federation:
        operator, agents, add, clock = federation
        shed_to_b_and_c(federation, len(SHARES), rounds=0)
        a = agents["a"]
        boundary = threading.Event()
        stop = a.host.stop_task

        def slow_stop(key):
            checkpoint = stop(key)  # as Spark's: the query ends at once, the stop returns at the batch boundary
            assert boundary.wait(20), "the test's batch boundary never came"
            return checkpoint

        a.host.stop_task = slow_stop
        for _ in range(24):
            _round(agents, clock)
            if a.regrain.restarts:
                break
        assert a.regrain.restarts, "a split a task and began to restart it"
        restarting = set(a.regrain.restarts)
        steps, starts = a.steps, len(a.host.starts)
        for _ in range(3):
            _round(agents, clock)
        assert a.steps == steps + 3 and not a.errors, "a's loop ticked on while the restart's stop waited"
        assert not restarting & a.hosting() and len([k for k, _ in a.host.starts[starts:] if k in restarting]) == 0, \
            "a started the task again before its stop returned"

        boundary.set()
        for _ in range(200):
            if not a._stopping:
                break
            threading.Event().wait(0.05)
        for _ in range(3):
            _round(agents, clock)
        tasks = {f"a.{t['name']}": t for t in operator.tasks(origin="a")}
        for key in restarting:
            assert key in a.hosting() and a.host.sources[key].until_s == tasks[key]["until_s"] is not None, "restarted over its ended input"
        assert not a.regrain.restarts and not a.errors


def test_an_agent_splits_nothing_once_its_input_has_ended(tmp_path, own_brokers):
    """The same federation with a's input closed (its end-of-input mark the newest message):
    a split then could not complete (`spark_agents.broker.source.InputEnded`); the agent
    tells its state machine, which asks for no split again and says so once; its tasks
    drain as they are."""
    write_end(BrokerStream(own_brokers["a"].connection(), "a"), 60 * MICROS, range(4), Records(MONITORING))
    with stepped_federation(tmp_path, lambda now: _KeyGroupsHost(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers,
                            fixed_cost={"a": FIXED_COST}) as federation:
        operator, agents, _, _ = federation
        shed_to_b_and_c(federation, len(SHARES))
        a = agents["a"]
        assert not a.counts["splits"] and not [t for t in operator.tasks(origin="a") if t["from_tasks"]]
        said = [r.message for r in a.records if "stream has ended" in r.message]
        assert len(said) == 1 and said[0].startswith("no split, merge or move of its own tasks from now on"), said
        assert a.machine.mechanism.input_ended is not None
        assert not a.errors


def test_an_overloaded_agent_whose_input_has_ended_moves_none_of_its_tasks(tmp_path, own_brokers):
    """Eight tasks of 0.12 against a threshold of 0.5 shed to b and c while a's input runs
    (as nine do in `test_agent.test_overloaded_participant_sheds_until_acceptable`); once it has ended
    they only drain, and a move would hold the drain up: a offers none, and says why once."""
    write_end(BrokerStream(own_brokers["a"].connection(), "a"), 60 * MICROS, range(4), Records(MONITORING))
    with stepped_federation(tmp_path, lambda now: SteppedHost(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers) as federation:
        operator, agents, _, _ = federation
        shed_to_b_and_c(federation, 8)
        a = agents["a"]
        assert a.machine.mechanism.input_ended is not None and not a.counts["offers_made"], a.counts
        assert {t["host"] for t in operator.tasks(origin="a")} == {"a"}, "every task of a's drains where it ran"
        assert len([r for r in a.records if "stream has ended" in r.message]) == 1
        assert not a.errors


def test_partners_that_host_tasks_of_an_input_that_has_ended_learn_it_on_its_broker(tmp_path, own_brokers):
    """a sheds to b and c while its input runs; once it has ended, b and c read so on a's
    broker, as the tasks they host for a read it, and keep those tasks where they are."""
    with stepped_federation(tmp_path, lambda now: SteppedHost(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers) as federation:
        operator, agents, _, clock = federation
        shed_to_b_and_c(federation, 8)
        hosts = {t["host"] for t in operator.tasks(origin="a")} - {"a"}
        assert hosts, "a shed while its input ran"
        assert not any(agents[h].machine.mechanism.ended for h in hosts), "nothing has ended yet"
        write_end(BrokerStream(own_brokers["a"].connection(), "a"), 60 * MICROS, range(2 ** BITS), Records(MONITORING))  # as the feeder ends it
        for _ in range(30):  # an agent reads at each period it may trade (not while it settles)
            _round(agents, clock)
            if all(agents[h].machine.mechanism.ended for h in hosts):
                break
        for h in hosts:
            assert set(agents[h].machine.mechanism.ended) == {"a"}, (h, agents[h].machine.mechanism.ended)
            said = [r.message for r in agents[h].records if "stream has ended" in r.message]
            assert len(said) == 1 and said[0].startswith("no move of the tasks it hosts for a from now on"), said
            assert not agents[h].errors
        assert agents["a"].machine.mechanism.input_ended is not None


def test_an_agent_that_stopped_between_the_two_halves_of_a_split_registers_the_missing_one(tmp_path, own_brokers):
    with stepped_federation(tmp_path, lambda now: _KeyGroupsHost(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers,
                            fixed_cost={"a": FIXED_COST}) as (operator, agents, add, clock):
        a = add("a", 2)
        a.sync()
        first = {t["name"]: t for t in a.client.tasks(origin="a")}["g0"]
        a.client.register_task(f"g00-{first['id']}", input_uri=own_brokers["a"].location("00"), from_tasks=[first["id"]], since_s=600,
                               query=first["query"], query_digest=first["query_digest"])
        a = add("a", 2)  # restarted: it only finds the split half done in the registry
        a.sync()
        a.reads.mark(["task"])
        a.sync()
        tasks = {t["name"]: t for t in a.client.tasks(origin="a")}
        assert tasks[f"g01-{first['id']}"]["since_s"] == 600 and tasks[f"g01-{first['id']}"]["from_tasks"] == [first["id"]]
        assert a.host.sources["a.g0"].until_s == 600
        assert {"a.g0", "a.g1", f"a.g00-{first['id']}", f"a.g01-{first['id']}"} <= a.host.running()


def test_a_restarted_agent_keeps_its_bounds_on_splits_on_refusals_and_refuses_a_bad_memory(tmp_path):
    """The machine's memory of splits on refusals lives in the agent's own folder: a restart
    takes it back (so it does not split on refusals again what it had bounded); a file that
    is not that memory is noted and the count starts afresh."""
    from spark_agents.agent import SPLITS_FILE

    with stepped_federation(tmp_path, lambda now: _KeyGroupsHost(MM1Cost(a=0.25, c=1.0)), fixed_cost={"a": FIXED_COST}) as (_, _, add, _):
        a = add("a", 2)
        a.machine.mechanism.refused_splits, a.machine.mechanism.refusal_split = 1, frozenset({(MAIN, "01")})
        a.mechanism()
        assert (tmp_path / "a" / SPLITS_FILE).exists()
        a = add("a", 2)  # restarted: a new process, the same folder
        assert (a.machine.mechanism.refused_splits, a.machine.mechanism.refusal_split) == (1, frozenset({(MAIN, "01")}))
        for bad in ("not json", '{"refused_splits": 7, "refusal_split": []}', '{"refused_splits": 1, "refusal_split": ["../x"]}', "[]"):
            (tmp_path / "a" / SPLITS_FILE).write_text(bad)
            a = add("a", 2)
            assert (a.machine.mechanism.refused_splits, a.machine.mechanism.refusal_split) == (0, frozenset()), bad
            assert "agent.memory_unreadable" in [r.kind for r in a.records], bad


def test_a_half_of_a_split_task_moved_under_passive_standby_fails_over_over_its_own_span(tmp_path, own_brokers):
    """A split's half is a task like any other under HA: moved to b with a copy kept at a,
    b's death fails it over to a, which takes it over from the copy over the half's key
    groups and span (from the split time on), at the next epoch; the old task, ending at
    home, is not failed over or moved."""
    from bpm.negotiation import Task
    from bpm.zeek.definitions import QueryParams
    from bpm.zeek.generator import TrafficProfile, generate
    from spark_agents.broker.stream import Broker, BrokerStream
    from tests.spark_agents.conns import Feeder
    from tests.spark_agents.test_agent_ha import Fences, SteppedHAHost, _round, delta_http

    class Host(SteppedHAHost):
        def ha_take_over(self, task_id, mode, **kw):
            took = super().ha_take_over(task_id, mode, **kw)
            self.takeovers[-1]["stream"] = kw["stream"]
            return took

    broker, fences = own_brokers["a"], Fences()
    with stepped_federation(tmp_path, lambda now: Host(fences, now), {"window_s": 10}, brokers=own_brokers) as (operator, agents, add, clock):
        a, b = add("a", 1), add("b", 0)
        a.peers.transport = b.peers.transport = delta_http(agents)
        with Broker(broker.url, "a", broker.password) as mine:
            Feeder(BrokerStream(mine, "a"), QueryParams()).feed(generate(TrafficProfile(duration_s=30, rate=20), 1))
        a.sync()
        whole = a.client.tasks(origin="a")[0]
        a.read()
        a.regrain.split(Task(str(whole["id"]), 0.1, "a", groups=""))
        tasks = {t["name"]: t for t in a.client.tasks(origin="a")}
        at = tasks["g"]["until_s"]
        half = next(t for t in tasks.values() if t["from_tasks"] == [whole["id"]] and t["input_uri"].endswith("/1"))
        contract = a.client.propose("b", 1.0, 1.1, 300.0, ha_mode="passive_standby")  # outlasts the test
        b.client.contract_action(contract["id"], "accept")
        b.client.accept_offer(a.client.offer(contract["id"], [half["id"]], 1.1)["id"])
        moved = next(t for t in a.client.tasks(origin="a") if t["id"] == half["id"])
        assert moved["host"] == "b" and moved["since_s"] == at  # its mode is the contract's
        key = f"a.{half['name']}"
        for _ in range(3):
            _round(agents, clock, "ab")
        assert key in b.host.running(), [(r.kind, r.message) for r in b.records]
        b.host.batch(key)
        assert b.host.ship_deltas() == 1 and a.ha.backups[key].applied is not None

        for _ in range(8):  # b stops: its process is gone
            _round(agents, clock, "a")
            if [f for f in operator.failovers() if f["kind"] == "failover"]:
                break
        failovers = [f for f in operator.failovers() if f["kind"] == "failover"]
        assert [(f["task"], f["to_host"], f["mode"]) for f in failovers] == [(key, "a", "passive_standby")], \
            ([(p["name"], p["status"]) for p in operator.participants()], [(r.kind, r.message) for r in a.records][-8:])
        [took] = [t for t in a.host.takeovers if t["task"] == key]
        source = took["stream"].source
        assert (source.prefix, source.since_s, source.until_s) == ("1", at, None), "the half's key groups and span"
        assert took["epoch"] == moved["epoch"] + 1 and took["backup"] is not None
        old = next(t for t in a.client.tasks(origin="a") if t["id"] == whole["id"])
        assert old["host"] == "a" and old["until_s"] == at and old["epoch"] == whole["epoch"]


def test_a_partner_that_does_not_have_the_tasks_query_refuses_them_and_the_other_takes_them(tmp_path, own_brokers):
    """b can run only another version of the query: it refuses every offer of a's tasks, with
    the reason; c, which has a's version, takes the load."""
    from dataclasses import replace

    from examples.network_monitoring import query as monitoring

    other = {monitoring.name: replace(monitoring, version="another")}
    assert other[monitoring.name].digest != monitoring.digest
    with stepped_federation(tmp_path, lambda now: _KeyGroupsHost(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers,
                            fixed_cost={"a": FIXED_COST}, settings={"b": {"queries": other}}) as federation:
        operator, agents, add, _ = federation
        shed_to_b_and_c(federation, len(SHARES))
        hosts = {t["host"] for t in operator.tasks(origin="a")}
        assert "b" not in hosts and "c" in hosts, hosts
        refusals = [e["message"] for e in operator.events(limit=500) if "which I do not have" in e["message"]]
        assert refusals and "runs query network-monitoring" in refusals[0], [(e["kind"], e["message"]) for e in operator.events(limit=60)]


def test_a_partner_refuses_a_task_whose_parameters_its_query_does_not_take(tmp_path, own_brokers):
    """A hostile origin registers a task of a query the host has, with parameters that query
    does not take, and offers it: the host refuses it, saying why, rather than accepting a task
    it could never start."""
    from examples.network_monitoring import query as monitoring

    with stepped_federation(tmp_path, lambda now: _KeyGroupsHost(MM1Cost(a=0.25, c=1.0)), brokers=own_brokers) as (operator, agents, add, clock):
        a, b = add("a", 1), add("b", 0)
        contract = a.client.propose("b", 1.0, 2.0, 5.0)
        b.client.contract_action(contract["id"], "accept")
        evil = a.client.register_task("evil", input_uri=own_brokers["a"].location(""), params={"windows": 3},
                                      query=monitoring.name, query_digest=monitoring.digest)
        offer = a.client.offer(contract["id"], [evil["id"]], 1.5)
        for _ in range(4):
            b.tick()
            clock.advance(1.0)
        [answered] = [o for o in b.client.offers() if o["id"] == offer["id"]]
        assert answered["state"] == "rejected", answered
        said = [r.message for r in b.records if r.kind == "offer.refused"]
        assert any(f"task #{evil['id']} cannot run here: query 'network-monitoring' has no parameter 'windows'" in m for m in said), \
            [(r.kind, r.message) for r in b.records]
