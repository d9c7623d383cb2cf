"""The agents' high availability, stepped in one process against the real registry app.

The Spark side is a host that runs no query: a task's "batch" bumps a counter in its
checkpoint folder and writes its rows through the real fenced sink over a fence kept in
memory (the stand-in for the one on the origin's broker); passive-standby deltas are real delta checkpoints of that folder, shipped through
the backup agent's `receive_delta`. What is tested is who does what: detection, failover,
the takeover each mode chooses, repair, and the returning host being fenced.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from bpm_http.client import RegistryError
from bpm.costs import MM1Cost
from bpm.tokens import TokenRefused
from bpm.results import Result
from bpm.zeek.definitions import ResultRow
from spark_agents.agent import Agent
from spark_agents.credentials import bearer
from spark_agents.ha.delta import DeltaShipper
from spark_agents.ha.fence import FencedError, FencedSink, FenceState, unwritten
from spark_agents.server import create_agent_app
from tests.spark_agents.stepped import stepped_federation

TASK_LOAD = 0.12


def _row(window_end: int, src: str = "10.0.0.1") -> Result:
    return ResultRow(kind="connections", window_start=window_end - 10, window_end=window_end, key=src, value=101).as_result()


class MemoryFence:
    """A task's output fence kept in memory, with the rules of the one on the origin's broker
    (`spark_agents.broker.results.BrokerFence`): a newer epoch's claim refuses every older one,
    and only results after the newest written are written."""

    def __init__(self, task_id: str) -> None:
        self.task_id, self.epoch, self.written_us, self.batches = task_id, None, None, []

    def state(self) -> FenceState:
        return FenceState(self.epoch, self.written_us)

    def check(self, epoch: int) -> None:
        if self.epoch is not None and self.epoch > epoch:
            raise FencedError(f"task {self.task_id}: epoch {epoch} is fenced; epoch {self.epoch} holds its output")

    def claim(self, epoch: int) -> FenceState:
        self.check(epoch)
        self.epoch = epoch
        return self.state()

    def write(self, epoch, batch_id, rows, run):
        self.claim(epoch)
        fresh = unwritten(rows, self.written_us)
        if not fresh:
            return None, len(rows)
        self.written_us = max([r.time_us for r in fresh] + ([self.written_us] if self.written_us is not None else []))
        self.batches.append(fresh)
        return len(self.batches), len(rows) - len(fresh)

    def progress(self, epoch, closed):
        self.claim(epoch)


class Fences(dict):
    """The fences of a federation's tasks, by task."""

    def __missing__(self, task_id: str) -> MemoryFence:
        self[task_id] = MemoryFence(task_id)
        return self[task_id]


class SteppedHAHost:
    """A task host that runs nothing by itself; `batch(key)` runs one batch of a task.

    Attributes:
        starts: (task, epoch or None, batches in its checkpoint) per start.
        takeovers: the arguments of every takeover.
        duties: the running host duties per task: (mode, consumer, ship, shipper).
        streams: the input each duty acknowledges.
        replicas: active-standby replicas running here.
    """

    def __init__(self, fences: Fences, clock) -> None:
        self.fences = fences
        self.clock = clock
        self.cost = MM1Cost(a=0.25, c=1.0)
        self._running: dict[str, Path] = {}
        self.sinks: dict[str, FencedSink | None] = {}
        self.starts: list[tuple[str, int | None, int]] = []
        self.takeovers: list[dict] = []
        self.duties: dict[str, tuple] = {}
        self.streams: dict[str, object] = {}  # the input each duty acknowledges (`spark_agents.broker.inputs`)
        self.replicas: dict[str, Path] = {}
        self.batch_times: dict[str, list[float]] = {}

    def start_task(self, task_id, source, checkpoint_dir, params, epoch, query=None):
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        count = self._count(checkpoint_dir)
        self.starts.append((task_id, epoch, count))
        self._running[task_id] = checkpoint_dir
        self.sinks[task_id] = FencedSink(self.fences[task_id], epoch)

    @staticmethod
    def _count(checkpoint_dir: Path) -> int:
        state = checkpoint_dir / "batches"
        return int(state.read_text()) if state.exists() else 0

    def batch(self, task_id: str, rows: list[ResultRow] = ()) -> None:
        """One batch: the checkpoint advances, the rows go through the task's sink."""
        checkpoint = self._running[task_id]
        count = self._count(checkpoint) + 1
        (checkpoint / "batches").write_text(str(count))
        sink = self.sinks.get(task_id)
        if sink is not None:
            sink(count, list(rows))
        self.batch_times.setdefault(task_id, []).append(self.clock())

    def stop_task(self, task_id):
        self.sinks.pop(task_id, None)
        return self._running.pop(task_id)

    def end_output(self, task_id, until_s):
        if task_id in self.sinks:
            self.sinks[task_id].until_s = until_s

    def running(self):
        return set(self._running) | set(self.replicas)

    def starting(self):
        return set()

    def loads(self):
        return {key: TASK_LOAD for key in self._running}

    def rising(self):
        return set()

    def cost_function(self):
        return self.cost

    def status(self):
        return {"tasks": sorted(self._running)}

    # HA

    def ha_start_duties(self, task_id, mode, stream, consumer, *, params, interval_s, ship, query=None):
        shipper = DeltaShipper(self._running[task_id]) if mode == "passive_standby" else None
        self.duties[task_id] = (mode, consumer, ship, shipper)
        self.streams[task_id] = stream

    def ship_deltas(self) -> int:
        """One round of every passive-standby duty: pack, ship, confirm."""
        shipped = 0
        for mode, consumer, ship, shipper in list(self.duties.values()):
            if shipper is not None:
                delta = shipper.pack()
                ship(delta.data)
                shipper.confirm(delta)
                shipped += 1
        return shipped

    def ha_stop_duties(self, task_id, release):
        self.duties.pop(task_id, None)

    def ha_duties_status(self, task_id):
        return {}

    def ha_start_replica(self, task_id, stream, checkpoint_dir, params, query=None):
        self.replicas[task_id] = checkpoint_dir

    def ha_stop_replica(self, task_id):
        self.replicas.pop(task_id, None)

    def ha_take_over(self, task_id, mode, *, epoch, stream, consumer, failed_consumer, params, checkpoint_dir, backup, query=None):
        replica = self.replicas.pop(task_id, None)
        self.takeovers.append({"task": task_id, "mode": mode, "epoch": epoch, "backup": backup, "replica": replica,
                               "failed_consumer": failed_consumer, "checkpoint": checkpoint_dir})
        self.fences[task_id].claim(epoch)  # as take_over does, before anything runs
        folder = backup.backup_dir if backup is not None else (replica or checkpoint_dir)
        self.start_task(task_id, None, Path(folder), params, epoch)
        return {"start_position": None, "promoted_rows": 0, "takeover_s": 0.0}

    def ha_first_output(self, task_id, since):
        times = [t for t in self.batch_times.get(task_id, []) if t >= since]
        return min(times) if times else None


def delta_http(agents: dict[str, Agent]) -> httpx.MockTransport:
    """Agents' HTTP between each other, in process: the delta endpoint of the addressed agent
    (an agent's `peers.transport`)."""

    def deliver(request: httpx.Request) -> httpx.Response:
        _, name, _, key, _ = request.url.path.split("/", 4)
        token = bearer(request.headers.get("Authorization"))
        try:
            body = agents[name].ha.receive_delta_from_caller(token, key, int(request.url.params["epoch"]), request.content)
        except TokenRefused as exc:
            return httpx.Response(exc.status, json={"detail": str(exc)})
        except PermissionError as exc:
            return httpx.Response(409, json={"detail": str(exc)})
        return httpx.Response(200, json=body)

    return httpx.MockTransport(deliver)


@pytest.fixture
def federation(tmp_path):
    fences = Fences()
    with stepped_federation(tmp_path, lambda now: SteppedHAHost(fences, now), {"window_s": 10}) as federation:
        _, agents, add, _ = federation

        def add_with_http(name: str, tasks: int) -> Agent:
            agent = add(name, tasks)
            agent.peers.transport = delta_http(agents)
            return agent

        yield federation[0], agents, add_with_http, federation[3]


def _contract(agents, a, b, mode, duration=300.0):
    proposed = agents[a].client.propose(b, 1.0, 1.1, duration, ha_mode=mode)
    agents[b].client.contract_action(proposed["id"], "accept")


def _round(agents, clock, live, seconds=1.0):
    for name in live:
        agents[name].tick()
    clock.advance(seconds)


def _shed_to_b(operator, agents, add, clock, mode):
    """a (overloaded) sheds to b under a contract of `mode`; returns the tasks b hosts for a."""
    add("a", 9)
    add("b", 0)
    add("c", 0)
    _contract(agents, "a", "b", mode)
    _contract(agents, "a", "c", "none")
    for _ in range(4):
        _round(agents, clock, "abc")
    moved = [t for t in operator.tasks(host="b") if t["origin"] == "a"]
    assert moved, "a shed load to b"
    agents["a"].machine.mechanism.warmup_s = 1e9  # a trades no more: what follows is HA's doing alone
    return moved


def _kill_b_and_detect(operator, agents, clock):
    """b stops ticking (its process is gone); a and c go on until a failed b's tasks over."""
    for _ in range(6):
        _round(agents, clock, "ac")
        if operator.failovers():
            break
    statuses = {p["name"]: p["status"] for p in operator.participants()}
    assert statuses["b"] in ("suspected", "failed")
    return operator.failovers()


def test_passive_standby_detection_failover_takeover_repair_and_fencing(federation):
    operator, agents, add, clock = federation
    moved = _shed_to_b(operator, agents, add, clock, "passive_standby")
    a, b, c = agents["a"], agents["b"], agents["c"]
    keys = [f"a.{t['name']}" for t in moved]

    # The origin placed the backups; the host writes through the fence and ships deltas to them.
    replicas = operator.replicas()
    assert {(r["task"], r["participant"], r["role"], r["state"]) for r in replicas} == {(k, "a", "passive_standby", "active") for k in keys}
    assert all(epoch is not None for key, epoch, _ in b.host.starts if key in keys), "moved tasks are fenced at b"
    for key in keys:
        b.host.batch(key, [_row(100)])
    assert b.host.ship_deltas() == len(keys)
    assert set(a.ha.backups) == set(keys) and all(x.applied is not None for x in a.ha.backups.values())
    synced = {r["task"]: r for r in operator.replicas()}
    assert all(synced[k]["synced_at"] and synced[k]["bytes_copied"] > 0 for k in keys)
    b.host.batch(keys[0], [_row(110)])  # after the last copy: the takeover replays it

    # b dies. a (the origin) detects it from the registry's liveness and fails over at once, to itself (the backup).
    records = _kill_b_and_detect(operator, agents, clock)
    failovers = [f for f in records if f["kind"] == "failover"]
    assert {f["task"] for f in failovers} == set(keys)
    assert all(f["to_host"] == "a" and f["failed"] == "b" and f["mode"] == "passive_standby" for f in failovers)
    assert {m["state"] for m in operator.movements() if m["to"] == "b"} == {"failed"}
    took = {t["task"]: t for t in a.host.takeovers}
    assert set(took) == set(keys)
    assert all(t["mode"] == "passive_standby" and t["backup"] is not None and t["backup"].applied is not None for t in took.values())
    # Restarted from the copy: the checkpoint is the one b shipped (one batch), not a's stale one or nothing.
    assert all(count == 1 for key, _, count in a.host.starts if key in keys and (key, _, count) == a.host.starts[-1])
    assert all(b_ is None for b_ in [a.ha.backups.get(k) for k in keys]), "the copy became the checkpoint"

    # The new host completes each failover at the task's first output after it.
    for key in keys:
        a.host.batch(key, [_row(120)])
    _round(agents, clock, "ac")
    done = {f["task"]: f for f in operator.failovers() if f["kind"] == "failover"}
    assert all(done[k]["completed_at"] is not None and done[k]["recovery_s"] is not None for k in keys)

    # Repair: the copies at a were promoted; the replication level comes back at c, a live partner.
    for _ in range(2):
        _round(agents, clock, "ac")
    repaired = [r for r in operator.replicas() if r["participant"] == "c" and r["state"] == "active"]
    assert {r["task"] for r in repaired} == set(keys)
    assert {f["task"] for f in operator.failovers() if f["kind"] == "repair"} == set(keys)
    a.host.ship_deltas()  # a hosts them now and ships to c
    _round(agents, clock, "ac")
    assert set(c.ha.backups) == set(keys)
    repairs = [f for f in operator.failovers() if f["kind"] == "repair"]
    assert all(f["completed_at"] is not None and f["to_host"] == "c" for f in repairs)

    # b comes back: its late writes are refused by the fence, and it stops the tasks it lost.
    with pytest.raises(FencedError):
        b.host.batch(keys[0], [_row(200)])
    b.tick()
    assert not set(keys) & b.host.running()
    kinds = [r.kind for r in a.records]
    assert {"failover.requested", "task.taken_over", "failover.completed", "replica.repaired"} <= set(kinds)

    # What a decided on HA follows from the observations its participant machine was given
    # alone: replayed into its HA machine as it started, they give the same failovers and
    # replicas. (Its mechanism's part does not replay whole here: the test changed its warm-up
    # midway, behind the machine's back.)
    import copy

    from bpm.ha.machine import FailOver, Observed, PlaceReplica

    observed = [(event, out) for event, out in a.machine.journal.entries if isinstance(event, Observed)]
    decided = [i for _, out in observed for i in out]
    assert {i.key for i in decided if isinstance(i, FailOver)} == set(keys) and any(isinstance(i, PlaceReplica) for i in decided)
    ha = copy.deepcopy(a.machine.journal.start.ha)
    assert a.machine.journal.dropped == 0 and all(tuple(ha.handle(event)) == out for event, out in observed)


def test_a_host_silent_to_the_registry_that_answers_its_origin_keeps_its_tasks_until_it_answers_no_more(federation):
    operator, agents, add, clock = federation
    moved = _shed_to_b(operator, agents, add, clock, "passive_standby")
    answering = {"b"}

    def health(request: httpx.Request) -> httpx.Response:
        name = request.url.path.strip("/").split("/")[0]
        return httpx.Response(200 if request.url.path.endswith("/healthz") and name in answering else 503)

    agents["a"].peers.transport = httpx.MockTransport(health)
    for _ in range(6):  # b is cut off from the registry only: it stops heartbeating, and still answers a
        _round(agents, clock, "ac")
    assert {p["name"]: p["status"] for p in operator.participants()}["b"] in ("suspected", "failed")
    assert operator.failovers() == [], "its origin reaches it: no failover"
    assert {t["host"] for t in operator.tasks() if t["id"] in {m["id"] for m in moved}} == {"b"}
    assert [r.message.split()[0] for r in agents["a"].records if r.kind == "ha.reachable"] == ["b"], "said once"
    answering.clear()  # now cut off from a too
    failovers = _kill_b_and_detect(operator, agents, clock)
    assert {f["task"] for f in failovers if f["kind"] == "failover"} == {f"a.{t['name']}" for t in moved}


@pytest.mark.parametrize("mode", ["none", "upstream_backup", "active_standby"])
def test_each_mode_takes_over_its_own_way(federation, mode):
    operator, agents, add, clock = federation
    moved = _shed_to_b(operator, agents, add, clock, mode)
    a, b = agents["a"], agents["b"]
    keys = {f"a.{t['name']}" for t in moved}
    if mode == "active_standby":
        assert set(a.host.replicas) == keys, "the origin runs a replica of each task it moved"
        assert keys <= a.host.running() and not keys & set(a.host._running), "and does not run the task itself"
    else:
        assert not a.host.replicas and not [r for r in operator.replicas() if r["state"] == "active"]
    if mode != "none":
        assert {b.host.duties[k][0] for k in keys} == {mode}
    _kill_b_and_detect(operator, agents, clock)
    took = {t["task"]: t for t in a.host.takeovers}
    assert set(took) == keys
    assert {t["mode"] for t in took.values()} == {mode}
    if mode == "active_standby":
        assert all(t["replica"] is not None for t in took.values()), "the replica was promoted"
        assert not a.host.replicas
    for key in keys:
        assert a.host.fences[key].state().epoch == took[key]["epoch"], "the new host holds the fence"


def test_a_normal_end_drops_the_replicas(federation):
    operator, agents, add, clock = federation
    add("a", 9)
    add("b", 0)
    _contract(agents, "a", "b", "passive_standby", duration=5.0)
    for _ in range(4):
        _round(agents, clock, "ab")
    assert [r for r in operator.replicas() if r["state"] == "active"]
    for key in agents["a"].host._running:
        agents["a"].host.cost = MM1Cost(a=0.01, c=1.0)  # hosting at home became cheap: the origin ends the movements
    for _ in range(10):
        _round(agents, clock, "ab")
    assert operator.movements(state="ended")
    away = [t for t in operator.tasks() if t["away"]]
    held = {r["task"] for r in operator.replicas() if r["state"] == "active"}
    assert held == {f"a.{t['name']}" for t in away}, "replicas only of tasks still away"
    assert not agents["b"].ha.duties.keys() - {f"a.{t['name']}" for t in away}


def test_agreed_terms_carry_the_contract_ha_mode():
    from bpm.federation.views import AgreedTerms

    terms = AgreedTerms.parse("b:1:1.1:15:passive_standby")
    assert terms.ha_mode == "passive_standby" and AgreedTerms.parse("b:1:1.1:15").ha_mode == "none"
    contract = {"price_min": 1.0, "price_max": 1.1, "min_duration_s": 15.0, "ha_mode": "passive_standby"}
    assert terms.matches(contract) and not AgreedTerms.parse("b:1:1.1:15").matches(contract)
    with pytest.raises(ValueError):
        AgreedTerms.parse("b:1:1.1:15:mirrored")


def test_reconcile_takes_a_failed_over_task_over_instead_of_fetching_it():
    from bpm.federation.views import reconcile, task_ha_mode

    task = {"id": 1, "name": "p0", "origin": "a", "host": "a", "epoch": 2, "ha_mode": "none"}
    movements = [{"id": 1, "task_id": 1, "from": "a", "to": "b", "state": "failed", "contract_id": 7}]
    record = {"id": 3, "task_id": 1, "kind": "failover", "to_host": "a", "to_epoch": 2, "mode": "passive_standby"}
    plan = reconcile("a", [task], set(), movements, [record])
    assert plan.start[0].source is None and plan.start[0].failover == record
    assert reconcile("a", [task], set(), movements).start[0].source == "b", "without the failover it would fetch from b"
    assert task_ha_mode(task, movements, [{"id": 7, "ha_mode": "upstream_backup"}], [record]) == "passive_standby"
    assert task_ha_mode(task, movements, [{"id": 7, "ha_mode": "upstream_backup"}]) == "upstream_backup"
    moved_on = {**task, "epoch": 3}  # a movement since the failover: the failover no longer applies
    assert reconcile("a", [moved_on], set(), movements, [record]).start[0].failover is None


def test_a_forged_delta_does_not_touch_a_backup(federation):
    """Only the task's host, with the registry's token for a delta to this holder, for this
    task and epoch, replaces a backup: a sender that names itself gets nowhere."""
    operator, agents, add, clock = federation
    moved = _shed_to_b(operator, agents, add, clock, "passive_standby")
    a, b, c = agents["a"], agents["b"], agents["c"]
    key, other = f"a.{moved[0]['name']}", f"a.{moved[-1]['name']}"
    b.host.batch(key, [_row(100)])
    b.host.ship_deltas()
    before = a.ha.backups[key].applied
    epoch = moved[0]["epoch"]
    with pytest.raises(TokenRefused) as missing:
        a.ha.receive_delta_from_caller(None, key, epoch, b"forged")
    assert missing.value.status == 401
    with pytest.raises(RegistryError) as not_host:
        c.credentials.token(moved[0]["id"], "delta", "a", epoch)
    assert not_host.value.status == 409
    if other != key:  # b's token for another task's delta is no good for this one
        with pytest.raises(TokenRefused) as elsewhere:
            a.ha.receive_delta_from_caller(b.credentials.token(moved[-1]["id"], "delta", "a", epoch), key, epoch, b"forged")
        assert elsewhere.value.status == 403
    assert a.ha.backups[key].applied == before
    # Through the agent's API: refused on the token, before a byte of the body is read.
    status, reads = _post_unread(create_agent_app(a), f"/ha/{key}/delta", f"epoch={epoch}")
    assert (status, reads) == (401, 0)
    assert a.ha.backups[key].applied == before


def _post_unread(app, path: str, query: str) -> tuple[int, int]:
    """POST to the ASGI `app` with a 1 MiB body; (status, how many times the app asked for the body)."""
    reads, sent = [], []

    async def receive():
        reads.append(1)
        return {"type": "http.request", "body": b"x" * 2**20, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": query.encode(), "root_path": "", "client": ("127.0.0.1", 1), "server": ("a", 80),
             "headers": [(b"host", b"a"), (b"content-length", str(2**20).encode())]}
    asyncio.run(app(scope, receive, send))
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), len(reads)
