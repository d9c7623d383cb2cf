"""The participant's agent: hosts its tasks on Spark and runs the mechanism's loop.

The agent reads the registry only when something that concerns it changed: its heartbeat
(every `heartbeat_s`) returns the registry's change notices (`api.services.changes`) and
its partners' liveness; the agent reads again the kinds that changed (its tasks with their
movements, failovers and replicas; its offers; its contracts), everything at start and every
`resync_s`, and acknowledges the notices with its next heartbeat. In steady state that is
one request per heartbeat.

Every tick the agent makes what it runs agree with what it read (tasks that arrived are
started from the checkpoint their previous host releases, or taken over when a failover
gave them; tasks that left are stopped at a batch boundary and wait for their new host to
fetch the checkpoint), does its high-availability duties (`spark_agents.ha_agent`: failure
detection and failover of its moved tasks, replicas, delta checkpoints, repair) and sends
its heartbeat; a keep-alive thread repeats the last heartbeat while a long step runs, so
partners do not take a busy agent for a failed one. The mechanism's decisions are a state
machine (`bpm.agent.machine`, shared with the simulator): every tick the agent feeds it
the time, and every period what the participant sees; it carries out what the machine
returns (answer offers made to it, end movements that no longer pay, make its next offer,
record a decision not taken). Each step is guarded and timed: a failure is logged, reported to the
registry as an event, and the loop goes on.
"""

from __future__ import annotations

import functools
import json
import logging
import ssl
import threading
import time
from collections import Counter, deque
from concurrent import futures
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import httpx

from bpm_http.client import RegistryClient
from bpm.costs.base import CostFunction
from bpm.federation.views import (
    AgreedTerms,
    active_contracts,
    contract_steps,
    key_groups,
    reconcile,
    task_input,
)
from bpm.keygroups import MAIN, is_location, parse_location
from bpm.load import default_warmup_s
from bpm.names import inside, task_key
from bpm.agent.reads import KEYS, Reads
from bpm.agent.view import Read, offers_to_answer, see
from bpm.agent.machine import (
    Accept,
    Contracts,
    End,
    Event,
    Gather,
    InputEnded,
    Instruction,
    MakeOffer,
    Merge,
    Period,
    Refuse,
    Split,
    SplitsRemembered,
    TasksChanged,
    Tick,
    View,
    Wait,
)
from bpm.agent.participant import ParticipantMachine
from bpm.negotiation import DEFAULT_HYSTERESIS
from bpm.dpc import Alert
from bpm.query import Query
from spark_agents import handover
from spark_agents.broker.access import OwnBroker, ask_credentials
from spark_agents.broker.server import BrokerError
from spark_agents.broker.source import InputEnded as StreamEnded
from spark_agents.broker.source import JetStreamInput
from spark_agents.correlation import Correlation, Endpoint, ask_alerts_credentials
from spark_agents.credentials import Credentials, write_private
from spark_agents.ha_agent import HADuties
from spark_agents.races import Races, Refused
from spark_agents.regrain import Regrain
from spark_agents.settings import default
from spark_agents.tls import Peers

if TYPE_CHECKING:
    from spark_agents.broker.inputs import TaskInput

log = logging.getLogger("bpm.agent")


class TaskHost(Protocol):
    """What the agent needs of the side that runs its tasks: on Spark, `spark_agents.runtime.SparkTasks`
    over a `spark_agents.host.SparkHost`; in the tests and the control-plane benchmark, simulated hosts."""

    def start_task(self, task_id: str, source: JetStreamInput | None, checkpoint_dir: Path, params: Mapping[str, Any], epoch: int, *,
                   query: str | None = None) -> None:
        """Start (resume) a task of the query named `query` over `source` (None: the task names
        no input), writing through its output fence at `epoch`."""

    def stop_task(self, task_id: str) -> Path: ...

    def end_output(self, task_id: str, until_s: int | None) -> None:
        """From now on leave out of the running task's output every window starting at or
        after `until_s` (None: none): a split or merge hands its key groups over then."""

    def running(self) -> set[str]: ...

    def starting(self) -> set[str]:
        """The running tasks whose query is still starting: the agent starts one query over a
        broker stream at a time."""

    def loads(self) -> dict[str, float]:
        """Each running task's load; a task may be missing while it has not been measured here yet."""

    def rising(self) -> set[str]:
        """The running tasks whose load, as `loads` reads it, is still rising (their input has
        just begun): they count in the load, but are not offered at it."""

    def cost_function(self) -> CostFunction: ...

    def status(self) -> dict[str, Any]: ...


@runtime_checkable
class HATaskHost(TaskHost, Protocol):
    """A task host that also carries out the HA roles (`spark_agents.ha_agent.HADuties`,
    `spark_agents.runtime.SparkTasks`'s `ha_*` methods)."""

    def ha_start_duties(self, task_id: str, mode: str, stream: TaskInput, consumer: str, *,
                        query: str | None, params: dict[str, Any], interval_s: float, ship: Callable) -> None: ...

    def ha_stop_duties(self, task_id: str, release: bool) -> None: ...

    def ha_duties_status(self, task_id: str) -> dict[str, Any]: ...

    def ha_start_replica(self, task_id: str, stream: TaskInput, checkpoint_dir: Path, params: dict[str, Any], *,
                         query: str | None = None) -> None: ...

    def ha_stop_replica(self, task_id: str) -> None: ...

    def ha_take_over(self, task_id: str, mode: str, *, epoch: int, stream: TaskInput, consumer: str, failed_consumer: str | None,
                     query: str | None, params: dict[str, Any], checkpoint_dir: Path, backup: Any) -> dict[str, Any]: ...

    def ha_first_output(self, task_id: str, since: float) -> float | None: ...


@dataclass(frozen=True)
class OwnTask:
    """A task this participant brings to the federation, running the query named `query` whose
    definition has digest `query_digest` (`bpm.query`; None: a task of no query, simulated)."""

    name: str
    input_uri: str
    params: dict = field(default_factory=dict)
    query: str | None = None
    query_digest: str | None = None


# The consumers of my stream are swept when a grant ends, and this often besides (made in
# nobody's name, or too many): listing them at every tick would cost a request a tick.
SWEEP_S = 5.0
CORRELATE_S = 2.0  # how often the agent shares newly closed windows and checks whom it correlates with
KEY_FILE = "participant.key"  # in the agent's work folder: the key it registered with, or rotated to
SPLITS_FILE = "splits.json"  # in the agent's work folder: its state machine's memory of splits on refusals
END_READ_WAIT_S = 1.0  # how long a period waits for the reads of whether inputs have ended (`Agent._inputs_ended`)
STOP_WAIT_S = 1.0  # how long a sync waits for the stops of tasks that left (`Agent.release_all`)
# How many events the state machine keeps with the instructions they gave (`bpm.agent.participant.Journal`):
# about an hour of ticks, each a second, with the periods between them.
JOURNAL_LENGTH = 5000


def send_stream_ack(endpoint: str, key: str, epoch: int, seq: int, token: str, *, verify: ssl.SSLContext | bool = True) -> None:
    """POST an acknowledgement of task `key`'s share of its origin's stream to the origin's agent at `endpoint`."""
    response = httpx.post(f"{endpoint.rstrip('/')}/broker/{key}/ack", params={"epoch": epoch, "seq": seq},
                          headers={"Authorization": f"Bearer {token}"}, timeout=10.0, verify=verify)
    if response.status_code != 204:
        raise RuntimeError(f"{endpoint} refuses the acknowledgement of {key} up to {seq}: {response.status_code} {response.text[:200]}")


def in_background(call: Callable[[], object], name: str) -> futures.Future:
    """`call` run in a daemon thread of its own: its future, which the caller may stop waiting
    for (a read of a broker that is cut off ends only with its timeout, and holds up neither
    the caller nor the process's exit)."""
    future: futures.Future = futures.Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:  # handed to whoever reads the future
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def write_key(path: Path, key: str) -> None:
    """Keep the participant's key readable by its owner only, replaced in one step."""
    write_private(path, key + "\n")


@dataclass
class AgentConfig:
    """How one participant's agent runs (its defaults those of `bpm agent run`, `spark_agents.settings`).

    Attributes:
        period_s: how often the mechanism runs (offers, answers, ends); Borealis used 7 s.
        tick_s: how often the agent reconciles its tasks with what it read of the registry,
            does its HA duties and feeds the state machine.
        heartbeat_s: how often it sends its heartbeat, which brings the change notices (at
            most the registry's heartbeat timeout, so that partners do not suspect it).
        resync_s: how often it reads everything again, whatever the notices say.
        hysteresis: the relative margin of `bpm.negotiation` on ending movements.
        margin: the relative margin of `bpm.negotiation` on offering and accepting load.
        reference_price: the price at which its threshold is reported; by default the
            lowest price_min of its active contracts.
        contracts: terms agreed offline with partners; the agent brings them into the
            registry (`bpm.federation.views.contract_steps`).
        warmup_s: how long after start the agent neither offers nor takes load
            (`bpm.agent.machine.Mechanism`; `bpm.load.default_warmup_s` for its trigger).
        pass_on: whether the agent offers tasks it hosts for others on to its own partners
            (a movement of its own; see docs/mechanism.md, "Passing load on"): never a task
            with an HA mode, nor under a contract that replicates moved tasks
            (`bpm.negotiation.not_offerable`).
        settle_s: how long after a task starts or stops here (or it accepts an offer or ends
            a movement) the agent neither offers, answers offers nor ends movements: until
            its load window has seen only the tasks it runs now (`bpm.agent.machine.Mechanism`).
        ha: whether the agent does high-availability duties (needs a host with the `ha_*`
            methods of `spark_agents.runtime.SparkTasks`).
        ha_interval_s: how often a host ships passive-standby deltas and acknowledges the stream.
        fetch_timeout_s: how long one tick waits for a previous host to release a checkpoint.
        fixed_cost: what a running task costs whatever its input, in units of load (`bpm
            bench fixed-cost` measures it): with it, the agent splits its own tasks over their
            key groups where their size keeps load from moving, and merges them back where it
            no longer does (`spark_agents.regrain`); None: tasks keep their size.
        correlate: whether the agent shares its alerts with its contract partners and
            correlates them with those they share (`spark_agents.correlation`; needs its own broker).
        availability_bound_s: how long the correlated result waits for a partner's alerts
            before it publishes a window tentative.
        queries: the queries this participant can run, by name (`bpm.query.Query`): it refuses
            offers of tasks of any other, or of another definition (digest,
            `bpm.agent.machine.Mechanism.queries`); None: any (hosts that run no Spark).
    """

    name: str
    workdir: Path
    endpoint: str
    tasks: list[OwnTask] = field(default_factory=list)
    period_s: float = default("period")
    tick_s: float = default("tick")
    heartbeat_s: float = default("heartbeat")
    resync_s: float = 300.0
    hysteresis: float = DEFAULT_HYSTERESIS
    margin: float = default("margin")
    reference_price: float | None = None
    offer_ttl_s: float = 20.0
    contracts: list[AgreedTerms] = field(default_factory=list)
    warmup_s: float = default_warmup_s(default("trigger"))
    pass_on: bool = default("pass_on")
    settle_s: float = default("settle")
    ha: bool = default("ha")
    ha_interval_s: float = default("ha_interval")
    fetch_timeout_s: float = 20.0
    fixed_cost: float | None = default("fixed_cost")
    correlate: bool = default("correlate")
    availability_bound_s: float = default("availability_bound")
    queries: Mapping[str, Query] | None = None
    insecure: bool = default("insecure")


@dataclass
class Record:
    at: float
    kind: str
    message: str


@dataclass
class Seen:
    """What the agent last read of the registry, each part read again when a notice of its kind arrives.

    Attributes:
        tasks, movements, failovers, replicas: the tasks that concern it and their records (kind task);
            failovers and replicas only with HA duties.
        offers: those pending made by it and to it, and its own decided since the last read (kind offer).
        contracts: its contracts in every state (kind contract).
        partners: the liveness of the participants that concern it, from its last heartbeat.
    """

    tasks: list[dict] = field(default_factory=list)
    movements: list[dict] = field(default_factory=list)
    failovers: list[dict] = field(default_factory=list)
    replicas: list[dict] = field(default_factory=list)
    offers: list[dict] = field(default_factory=list)
    contracts: list[dict] = field(default_factory=list)
    partners: dict[str, str] = field(default_factory=dict)


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        client: RegistryClient,
        host: TaskHost,
        *,
        clock: Callable[[], float] = time.time,
        fetch: Callable[[str, str, int, str], bytes] | None = None,  # (endpoint, task key, epoch, token)
        broker: OwnBroker | None = None,
        ask_stream: Callable[[str, str, int, str], tuple[str, str]] | None = None,  # (endpoint, task key, epoch, token) -> (user, password)
        send_ack: Callable[[str, str, int, int, str], None] | None = None,  # (endpoint, task key, epoch, sequence, token)
        ask_alerts: Callable[[str, str], Endpoint] | None = None,  # (endpoint, token) -> where and how to read its alerts
    ) -> None:
        self.config = config
        self.broker = broker
        self.client = client
        self.host = host
        self.clock = clock
        self.records: deque[Record] = deque(maxlen=500)
        self.errors = 0
        self.steps = 0
        # What it did, counted as it is done (`_execute`); the keys: `spark_agents.exporter.AGENT_COUNTS`.
        self.counts: Counter[str] = Counter()
        self._lock = threading.RLock()
        self._handover_lock = threading.Lock()  # one checkpoint handed over at a time
        self._task_ids: dict[str, int] = {}  # task key -> registry id
        self._released: dict[str, int | None] = {}  # task key -> epoch at which it was handed over (None: the task left my view)
        self._stopping: set[str] = set()  # task keys waiting for their batch boundary to stop (`_release_locally`)
        self._sources: dict[str, JetStreamInput | None] = {}  # task key -> the input it was last started on here
        self._end_reads: dict[str, futures.Future] = {}  # participant -> a read of whether its input has ended (`_inputs_ended`)
        self.peers = Peers(client.participant, insecure=config.insecure)
        # Partners the origin's agent let into its broker on the registry's token, before its
        # next read of its tasks says so: (partner, task key, key-group prefix, writes results) -> when.
        self._stream_grants: dict[tuple[str, str, str, bool], float] = {}
        self._view_read_at = float("-inf")
        self.machine = ParticipantMachine.named(
            config.name, ha_interval_s=config.ha_interval_s, journal_length=JOURNAL_LENGTH, started_s=clock(), period_s=config.period_s,
            warmup_s=config.warmup_s, settle_s=config.settle_s, margin=config.margin, hysteresis=config.hysteresis, fixed_cost=config.fixed_cost,
            queries=None if config.queries is None else frozenset((n, q.digest) for n, q in config.queries.items()))
        self._split_memory = self._remembered_splits()
        self._answered: set[int] = set()  # my offers whose answer the machine has seen
        self.last_report: dict[str, Any] = {}
        self.last_loads: dict[str, float] = {}  # each running task's load by task key, as of `last_report` (whose load is their sum)
        self._reported: dict[str, float] = {}  # task key -> the load its host last reported to the registry
        self._contracts: list = []
        self.seen = Seen()
        self.reads = Reads(resync_s=config.resync_s, read_all_at=clock())  # what to read again (`bpm.agent.reads`)
        self.races = Races(lambda kind, message: self.note(kind, f"{config.name}: {message}"), self.reads.mark)
        self._swept_at = float("-inf")  # when the consumers of my stream were last swept (`_sweep_consumers`)
        self._beat_at: float | None = None  # when (on `clock`) the loop last sent its heartbeat
        # A fetch gives up after a while and is retried next tick, so that the loop goes on
        # (detection, other starts) while a previous host is slow or has just died.
        self.fetch = fetch or (lambda endpoint, key, epoch, token: handover.fetch(endpoint, key, epoch, token, timeout_s=config.fetch_timeout_s,
                                                                                 verify=self.peers.verify(endpoint)))
        self.credentials = Credentials(client, config.name, clock)
        self.ask_stream = ask_stream or (lambda endpoint, key, epoch, token: ask_credentials(endpoint, key, epoch, token, config.name,
                                                                                             verify=self.peers.verify(endpoint)))
        self.send_ack_to = send_ack or (lambda endpoint, key, epoch, seq, token: send_stream_ack(endpoint, key, epoch, seq, token,
                                                                                                verify=self.peers.verify(endpoint)))
        self.ask_alerts = ask_alerts or (lambda endpoint, token: ask_alerts_credentials(endpoint, token, config.name, verify=self.peers.verify(endpoint)))
        self.correlation: Correlation | None = None
        self._correlated_at = float("-inf")
        self._alert_readers: set[str] = set()  # partners that asked for my alerts on the registry's token
        self._beat_lock = threading.Lock()
        self._last_beat = 0.0
        self.ha = HADuties(self, interval_s=config.ha_interval_s) if config.ha and isinstance(host, HATaskHost) else None
        if config.ha and self.ha is None:
            self.note("agent.ha_off", f"{config.name}: no high availability: its task host ({type(host).__name__}) carries out no HA role")
        self.regrain = Regrain(self)

    # Records

    def _unrunnable(self, tasks: Iterable[Mapping]) -> dict[int, str]:
        """Why each of `tasks` (registry records) of a query I have could not run here: its
        parameters, which its origin chose, do not fit the query (`bpm.query.Query.bind`)."""
        from bpm.query import QueryError
        from spark_agents.query import bind_task

        out = {}
        for t in tasks:
            if self.config.queries and t.get("query") in self.config.queries:
                try:
                    bind_task(self.config.queries, task_key(t), t["query"], t.get("params") or {})
                except QueryError as exc:
                    out[t["id"]] = str(exc)
        return out

    def align_s(self, task: str, query: str | None, params: Mapping[str, Any]) -> int | None:
        """Where the results of `task` (of the query named `query`, with `params`) are
        independent of each other, seconds: its query's `align` (None: nowhere)."""
        from spark_agents.query import bind_task

        definition, bound, _ = bind_task(self.config.queries or {}, task, query, params)
        return definition.align_s(bound)

    def note(self, kind: str, message: str, *, report: bool = False, subject: str | None = None, data: dict | None = None) -> None:
        self.records.append(Record(self.clock(), kind, message))
        (log.warning if kind.endswith("error") else log.info)("%s: %s", kind, message)
        if report:
            try:
                self.client.report_event(kind, message, subject=subject, data=data)
            except Exception:  # the registry may be the thing that failed; the log keeps it
                log.debug("could not report %s to the registry", kind)

    def _racing(self, what: str, step: Callable[[], None]) -> Callable[[], None]:
        """`step`, where a lost race is not an error (`spark_agents.races`)."""

        def run() -> None:
            with self.races.lost(what):
                step()

        return run

    def guarded(self, name: str, step: Callable[[], None]) -> None:
        started = time.perf_counter()
        try:
            step()
        except Exception as exc:
            self.errors += 1
            self.note("agent.error", f"{self.config.name}: {name} failed: {type(exc).__name__}: {exc}", report=True)
        finally:
            elapsed = time.perf_counter() - started
            if elapsed > 5:
                log.info("%s took %.1f s", name, elapsed)

    # Setup

    def checkpoint_dir(self, key: str) -> Path:
        if self.ha is not None and key in self.ha.checkpoints:
            return self.ha.checkpoints[key]  # a promoted active-standby replica runs on its own copy
        return inside(self.config.workdir / "checkpoints", key)

    def hosting(self) -> set[str]:
        """The tasks running here as the task itself (not as an active-standby replica)."""
        standby = self.ha.standby_keys() if self.ha is not None else set()
        return set(self.host.running()) - standby

    def connect(self) -> None:
        """Register my own tasks (or find them again after a restart)."""
        mine = {t["name"]: t for t in self.client.tasks(origin=self.config.name)}
        for task in self.config.tasks:
            self._register(task, mine.get(task.name))
        for record in mine.values():  # added at run time (`POST /tasks`) before a restart, too
            self._task_ids.setdefault(task_key(record), record["id"])

    def add_task(self, task: OwnTask) -> dict:
        """Take on a new task of my own (a new query over a share of my stream); the next tick
        starts it. A task that names no query runs the one my own tasks run (or the only one
        I have). QueryError, before anything is registered, for a query I do not have or
        parameters it does not take."""
        if self.config.queries is not None:
            task = self._own_query(task)
        existing = {t["name"]: t for t in self.client.tasks(origin=self.config.name)}
        self.config.tasks.append(task)
        return self._register(task, existing.get(task.name))

    def _own_query(self, task: OwnTask) -> OwnTask:
        """`task` with the query it runs and that query's digest, its parameters checked (`add_task`)."""
        from bpm.query import QueryError
        from spark_agents.query import bind_task

        queries = self.config.queries or {}
        name = task.query
        if name is None:
            candidates = {t.query for t in self.config.tasks if t.query is not None} or set(queries)
            if len(candidates) != 1:
                raise QueryError(f"task {task.name}: name the query it runs, one of {', '.join(sorted(queries)) or 'none'}")
            name = candidates.pop()
        bind_task(queries, f"{self.config.name}.{task.name}", name, task.params)
        return replace(task, query=name, query_digest=queries[name].digest)

    def _register(self, task: OwnTask, record: dict | None) -> dict:
        if record is None:
            record = self.client.register_task(task.name, input_uri=task.input_uri, params=task.params, query=task.query,
                                               query_digest=task.query_digest)
            self.note("task.registered", f"registered task {task.name} (#{record['id']})")
        self._task_ids[task_key(record)] = record["id"]
        return record

    # The loop

    def run(self, stop: threading.Event) -> None:
        self.guarded("connect", self.connect)
        keep_alive = threading.Thread(target=self.keep_alive, args=(stop,), name="bpm-agent-keepalive", daemon=True)
        keep_alive.start()
        try:
            while not stop.is_set():
                started = self.clock()
                self.tick()
                stop.wait(max(0.0, self.config.tick_s - (self.clock() - started)))
        finally:
            if self.ha is not None:
                self.ha.close()
            if self.correlation is not None:
                self.correlation.close()
            self.peers.close()

    def keep_alive(self, stop: threading.Event) -> None:
        """Repeat the last heartbeat whenever the loop has sent none for a tick.

        Liveness is the process's, not the loop's: a tick that stops a task (up to 5 s) or
        fetches a checkpoint must not make partners fail this participant over.
        """
        while not stop.wait(self.config.heartbeat_s):
            if not self.last_report or time.monotonic() - self._last_beat < self.config.heartbeat_s:
                continue
            try:
                self._send_heartbeat(self.last_report)  # its answer's notices come again with the loop's next one
            except Exception:  # the loop reports errors; this only keeps the participant alive
                log.debug("keep-alive heartbeat failed", exc_info=True)

    def _send_heartbeat(self, report: dict) -> dict:
        with self._beat_lock:
            answer = self.client.heartbeat(self.config.name, report)
            self._last_beat = time.monotonic()
        return answer

    def tick(self) -> None:
        self.steps += 1
        self.guarded("sync", self.sync)
        if self.ha is not None and self.ha.resync:
            self.ha.resync = False  # a failover to me: take the task over in this tick
            self.reads.mark(["task"])
            self.guarded("sync", self.sync)
        # After the sync, so that the report counts the tasks it started; a change of tasks it
        # brings notice of is acted on in this tick still.
        # Due at the tick nearest its time: ticks that come a little early do not stretch it by a tick.
        if self._beat_at is None or self.clock() - self._beat_at >= self.config.heartbeat_s - self.config.tick_s / 2:
            self.guarded("heartbeat", self.heartbeat)
            if "task" in self.reads.stale:
                self.guarded("sync", self.sync)
        self.guarded("mechanism", self.mechanism)
        if self.config.correlate:
            self.guarded("correlation", self.correlate)

    def read(self) -> None:
        """Read again the kinds of record that changed (`Seen`); each kind's notices are
        acknowledged with the next heartbeat once it is read."""
        me, seen = self.config.name, self.seen
        for kind in self.reads.due(self.clock()):
            if kind == KEYS:  # the registry rotated its signing keys: the ones that verify my callers' tokens
                self.credentials.read_keys_now()
            elif kind == "task":
                self._view_read_at = self.clock()
                view = self.client.view(me)  # what concerns me, not the whole federation, in one read
                seen.tasks, seen.movements, seen.failovers, seen.replicas = view["tasks"], view["movements"], view["failovers"], view["replicas"]
            elif kind == "offer":
                # The pending ones, not the history: and those of mine that were pending and are no
                # longer, one by one, for their answer (one outstanding offer at a time).
                pending = self.client.offers(state="pending")
                still = {o["id"] for o in pending}
                decided = [self.client.get_offer(o["id"]) for o in seen.offers
                           if o["from"] == me and o["state"] == "pending" and o["id"] not in still]
                unseen = [o for o in seen.offers if o["state"] in ("accepted", "rejected") and o["id"] not in self._answered]  # until the machine hears
                seen.offers = pending + unseen + decided
                if any(o["state"] == "accepted" for o in decided):
                    self.reads.mark(["task"])  # my tasks moved
            else:
                seen.contracts = self.client.contracts(participant=me)
            self.reads.read(kind)

    def sync(self) -> None:
        """Run exactly the tasks the registry says I host."""
        me = self.config.name
        self.read()
        tasks, movements, failovers = self.seen.tasks, self.seen.movements, self.seen.failovers
        if self.ha is not None:
            self.ha.observe(self.seen)
        if self.broker is not None:
            if self.broker.grant(self.broker_grants()) or self.clock() - self._swept_at >= SWEEP_S:
                self.guarded("broker.sweep", self._sweep_consumers)
            self.guarded("broker.consumers", self._keep_consumers)
        with self._lock:  # a task whose stop has not returned still counts as running: nothing starts it again meanwhile
            running = self.hosting() | self._stopping
        plan = reconcile(me, tasks, running, movements, failovers)
        by_key = {task_key(t): t for t in tasks}
        self._reported = {key: t["load"] for key, t in by_key.items() if t.get("load") is not None}
        self.release_all([(key, by_key[key]["epoch"] if key in by_key else None) for key in plan.stop])
        if self.ha is not None:
            # Before the starts: a start may wait on a checkpoint fetch, detection must not.
            self.ha.act()
        for start in plan.start:
            if is_location(start.task.get("input_uri") or "") and self.host.starting():
                continue  # one query over a broker stream starts at a time (`TaskHost.starting`); the rest at later ticks
            # Each start on its own: one that cannot fetch its checkpoint yet holds up no other.
            key = task_key(start.task)
            if key in self.regrain.restarts:  # stopped here to start again: its own checkpoint is the task's
                what, step = f"restart {key}", (lambda s=start: self._start(s.task, None))
            elif start.failover is not None and self.ha is not None:
                what, step = f"take over {key}", (lambda s=start: self._take_over(s.task, s.failover))
            else:
                what, step = f"start {key}", (lambda s=start: self._start(s.task, s.source))
            self.guarded(what, self._racing(what, step))
        self.regrain.act(tasks)

    def release_all(self, stops: list[tuple[str, int | None]], *, leaving: bool = True) -> None:
        """Stop the tasks that left (key, epoch at which it was handed over), all at once: each
        waits for its own batch boundary, and one after another a saturated participant took
        a minute to let six go, each stop waiting for a batch the others slowed.

        The sync waits for them `STOP_WAIT_S` at most; a longer stop (a batch at a fraction of
        a CPU can take tens of seconds) ends in the background while the loop goes on: HA's
        detection, the heartbeat's notices and the mechanism do not wait for a batch to end.
        Until its stop returns a task counts as running here (`_stopping`): no second stop
        begins, the sync starts it nowhere again, and its checkpoint is handed over only once
        it has stopped (`release`). `leaving` False: the tasks stay here, and the sync starts them
        again once stopped (`Regrain` restarts a split task over its input's new end)."""
        stopping = [in_background(functools.partial(self.guarded, f"stop {key}", functools.partial(self._release_locally, key, epoch, leaving=leaving)),
                                  f"bpm-release-{key}") for key, epoch in stops]
        futures.wait(stopping, timeout=STOP_WAIT_S)

    def _release_locally(self, key: str, epoch: int | None, *, leaving: bool = True) -> None:
        """Stop `key` at a batch boundary, its checkpoint then ready for its new host. The wait
        for the boundary holds no lock (other stops, and the handover, go on meanwhile); the
        checkpoint is handed over only once the task is marked released (`release`).
        `leaving` False: a restart here, its HA duties kept and its checkpoint not released."""
        with self._lock:
            if key not in self.hosting() or key in self._stopping:
                return
            self._stopping.add(key)
        started = time.perf_counter()
        try:
            self.host.stop_task(key)
        finally:
            with self._lock:
                self._stopping.discard(key)
                self.regrain.stopped(key)
                self.tasks_changed()
                if leaving and key not in self.hosting():
                    self._released[key] = epoch
                    if self.ha is not None:
                        self.ha.stopped(key)
        then = "its checkpoint waits for its new host" if leaving else "it starts again here"
        self.note("task.released" if leaving else "task.stopped", f"stopped {key} at a batch boundary in {time.perf_counter() - started:.2f} s; {then}")

    def _take_over(self, task: Mapping, record: Mapping) -> None:
        key = task_key(task)
        with self._lock:
            self.ha.take_over(task, record)
            self.tasks_changed()
            self._released.pop(key, None)
            self._task_ids[key] = task["id"]

    def _start(self, task: Mapping, source: str | None) -> None:
        key = task_key(task)
        checkpoint = self.checkpoint_dir(key)
        epoch = task["epoch"]
        if self.ha is not None and source is not None and handover.local_epoch(checkpoint) != epoch and self.ha.failed(source):
            # The movement ended, but the host that holds the checkpoint has failed: recover from what is kept here.
            with self._lock:
                self.ha.recover_from_failed(task, source)
                self._released.pop(key, None)
                self._task_ids[key] = task["id"]
            return
        if self.ha is not None:
            # An active-standby replica here runs on this checkpoint folder: it stops before the task starts.
            self.ha.stop_standby(key, "the task itself starts here")
        if source is not None and handover.local_epoch(checkpoint) != epoch:
            endpoint = self.endpoint(source)
            fetched_at = time.perf_counter()
            token = self.credentials.token(task["id"], "handover", source, epoch)
            data = self.fetch(endpoint, key, epoch, token)
            handover.unpack(data, checkpoint, epoch)
            self.note(
                "task.received",
                f"received the checkpoint of {key} from {source} ({len(data)} bytes) in {time.perf_counter() - fetched_at:.2f} s",
                report=True,
                subject=source,
                data={"task_id": task["id"], "epoch": epoch},
            )
        else:
            handover.mark_epoch(checkpoint, epoch)
        source = self.stream_input(task)
        with self._lock:
            self.host.start_task(key, source, checkpoint, task.get("params") or {}, epoch=epoch, query=task.get("query"))
            self._sources[key] = source
            self.regrain.started(key, task.get("until_s"))
            self.tasks_changed()
            self._released.pop(key, None)
            self._task_ids[key] = task["id"]
        self.note("task.started", f"started {key} (epoch {epoch})")

    # The broker

    def stream_input(self, task: Mapping) -> JetStreamInput | None:
        """What a task reads: its share of its origin's broker stream with the credentials to
        read it (this participant's own for its own tasks; for another's, those its origin's
        agent grants on the registry's token), over the task's span of event time (a split's
        or merge's, `spark_agents.regrain`). None for a task that names no input (a
        simulated host's); ValueError for anything but a broker location."""
        uri, origin, key = task.get("input_uri") or "", task["origin"], task_key(task)
        if not uri:
            return None
        return replace(self._stream(uri, origin, key, task), since_s=task.get("since_s"), until_s=task.get("until_s"))

    def _stream(self, uri: str, origin: str, key: str, task: Mapping) -> JetStreamInput:
        if not is_location(uri):
            raise ValueError(f"{key} reads {uri!r}, not a broker stream (nats://host:port/participant/key-groups)")
        where = parse_location(uri)
        if where.participant != origin:
            raise ValueError(f"{key} names {where.participant}'s stream, not its origin {origin}'s: {uri}")
        if origin == self.config.name:
            if self.broker is None:
                raise RuntimeError(f"{key} reads {uri}, but this agent runs no broker (--broker-port)")
            return replace(self.broker.own_input(where), start_seq=self.regrain.start_after.get(key, 0))
        token = self.credentials.token(task["id"], "stream", origin, task["epoch"])
        user, password = self.ask_stream(self.endpoint(origin), key, task["epoch"], token)
        return JetStreamInput.at(where, user, password, tls=self.peers.broker_tls(origin))

    def broker_grants(self) -> dict[str, set[tuple[str, tuple[str, str], bool]]]:
        """Who may read what of my broker: each partner the tasks of mine the registry says it
        hosts (reading their key groups and writing their results) or holds an active-standby
        replica of (reading only), and those it showed a token for since my last read of my tasks."""
        me, grants = self.config.name, {}
        mine = {t["id"]: t for t in self.seen.tasks if t["origin"] == me and is_location(t.get("input_uri") or "")}
        for t in mine.values():
            if t["host"] != me:
                grants.setdefault(t["host"], set()).add((task_key(t), parse_location(t["input_uri"]).share, True))
        for r in self.seen.replicas:
            t = mine.get(r["task_id"])
            if t is not None and r["state"] == "active" and r["role"] == "active_standby" and r["participant"] not in (me, t["host"]):
                grants.setdefault(r["participant"], set()).add((task_key(t), parse_location(t["input_uri"]).share, False))
        with self._lock:
            self._stream_grants = {g: at for g, at in self._stream_grants.items() if at >= self._view_read_at}
            for partner, key, share, writes in self._stream_grants:
                grants.setdefault(partner, set()).add((key, share, writes))
        return grants

    def retained(self) -> dict[str, tuple[str, str]]:
        """The consumers my broker stream keeps input for (`spark_agents.broker.retention`), by
        name (`consumer_name`): for each task of mine under an HA mode, its host's and each
        active-standby replica holder's (a replica acknowledges nothing: what it reads stays)."""
        from spark_agents.ha.roles import consumer_name

        me, wanted = self.config.name, {}
        modes = self.ha.modes if self.ha is not None else {}
        mine = {t["id"]: t for t in self.seen.tasks
                if t["origin"] == me and is_location(t.get("input_uri") or "") and modes.get(task_key(t), "none") != "none"}
        for t in mine.values():
            wanted[consumer_name(task_key(t), t["host"])] = parse_location(t["input_uri"]).share
        for r in self.seen.replicas:
            t = mine.get(r["task_id"])
            if t is not None and r["state"] == "active" and r["role"] == "active_standby":
                wanted[consumer_name(task_key(t), r["participant"])] = parse_location(t["input_uri"]).share
        return wanted

    def _sweep_consumers(self) -> None:
        """Delete the consumers of my stream that no grant covers now (`OwnBroker.sweep`)."""
        self._swept_at = self.clock()
        swept = self.broker.sweep()
        if swept:
            self.note("broker.swept", f"deleted {len(swept)} consumers of {self.config.name}'s stream that no grant covers")

    def _keep_consumers(self) -> None:
        """Register the consumers my stream must keep input for, and release those of my tasks'
        former hosts and replicas, except while a failover of the task is open (its new host
        replays from the failed host's acknowledgement, then releases it)."""
        if self.broker is None or self.ha is None:
            return
        wanted = self.retained()
        retention = self.broker.retention()
        held = retention.acks()
        mine = {task_key(t) for t in self.seen.tasks if t["origin"] == self.config.name}
        open_failovers = {f["task"] for f in self.seen.failovers if f.get("completed_at") is None}
        for consumer, (input, prefix) in wanted.items():
            if consumer not in held:
                retention.register(consumer, prefix, input)
        for consumer in held:
            key = consumer.rpartition(".")[0]
            if consumer not in wanted and key in mine and key not in open_failovers:
                retention.release(consumer)

    def ack_from_caller(self, token: str | None, key: str, epoch: int, seq: int) -> None:
        """A partner's acknowledgement of my stream for task `key` (`spark_agents.broker.inputs.SentAcks`):
        taken from whoever the registry's token says hosts the task at `epoch`, if my last read
        of the registry agrees (`Refused` otherwise), for a sequence my stream has (ValueError otherwise)."""
        from spark_agents.ha.roles import consumer_name

        if self.broker is None:
            raise LookupError(f"{self.config.name} runs no broker")
        caller = self.credentials.verify(token, "stream", key, epoch).caller
        task = next((t for t in self.seen.tasks if task_key(t) == key and t["origin"] == self.config.name), None)
        if task is None or not is_location(task.get("input_uri") or ""):
            raise LookupError(f"{key} is not a task of {self.config.name}'s on its broker")
        if task["host"] != caller or task["epoch"] != epoch:
            raise Refused(f"{key} runs at {task['host']} at epoch {task['epoch']}, not at {caller} at {epoch}")
        retention = self.broker.retention()
        if seq > retention.broker.last_seq():
            raise ValueError(f"sequence {seq} is past the end of {self.config.name}'s stream")
        where = parse_location(task["input_uri"])
        retention.ack(consumer_name(key, caller), where.prefix, seq, where.input)

    def send_ack(self, task: Mapping, seq: int) -> None:
        """Acknowledge task `task`'s share of its origin's stream up to `seq`, at the origin's agent."""
        token = self.credentials.token(task["id"], "stream", task["origin"], task["epoch"])
        self.send_ack_to(self.endpoint(task["origin"]), task_key(task), task["epoch"], seq, token)

    def task_input(self, task: Mapping) -> TaskInput | None:
        """The task's input as the HA roles use it (`spark_agents.broker.inputs`; None: it names none)."""
        from spark_agents.broker.inputs import OwnAcks, SentAcks, TaskInput

        source = self.stream_input(task)
        if source is None:
            return None
        if task["origin"] == self.config.name:
            assert self.broker is not None
            return TaskInput(source, OwnAcks(self.broker.retention(), source.prefix, source.input), self.registry_epoch)
        return TaskInput(source, SentAcks(functools.partial(self.send_ack, dict(task))), self.registry_epoch)

    def registry_epoch(self, key: str) -> int | None:
        """The newest epoch the registry has given task `key` (None: a task this agent has not
        seen). What bounds the claims a task's output fence believes (`BrokerFence`)."""
        task_id = self._task_ids.get(key)
        return None if task_id is None else self.client.request("GET", f"/tasks/{task_id}")["epoch"]

    def stream_credentials_to_caller(self, token: str | None, key: str, epoch: int) -> dict[str, str]:
        """The credentials of my broker for whoever the registry's token says hosts my task
        `key` at `epoch`, or holds an active-standby replica of it (TokenRefused if nobody it
        vouches for): its user, now allowed to read the task's key groups and, for the host,
        write its results. `Refused` when the registry places the task elsewhere now
        and the caller holds no replica; LookupError when I run no broker or the task is not mine."""
        if self.broker is None:
            raise LookupError(f"{self.config.name} runs no broker")
        caller = self.credentials.verify(token, "stream", key, epoch).caller
        task_id = self._task_ids.get(key)
        if task_id is None:
            raise LookupError(f"{key} is not a task of {self.config.name}'s")
        current = self.client.request("GET", f"/tasks/{task_id}")
        hosts = current["host"] == caller and current["epoch"] == epoch
        if not hosts and not any(r["participant"] == caller and r["state"] == "active" and r["role"] == "active_standby"
                                 for r in self.client.replicas(task_id=task_id)):
            raise Refused(f"the registry gives {key} to {current['host']} at epoch {current['epoch']}, not to {caller} at {epoch}, "
                                  f"and {caller} holds no active-standby replica of it")
        if not is_location(current.get("input_uri") or ""):
            raise LookupError(f"{key} reads no broker stream")
        with self._lock:
            self._stream_grants[(caller, key, parse_location(current["input_uri"]).share, hosts)] = self.clock()
        self.broker.grant(self.broker_grants())
        self.note("broker.granted", f"let {caller} read {key}'s key groups of {self.config.name}'s stream (epoch {epoch}"
                  f"{'' if hosts else ', as its replica'})")
        return self.broker.credentials(caller)

    def correlate(self) -> None:
        """Every `CORRELATE_S`: share my alerts of the windows closed since, and correlate them
        with those of my partners under a contract in force that share theirs."""
        now = self.clock()
        if now - self._correlated_at < CORRELATE_S:
            return
        self._correlated_at = now
        if self.broker is None:
            raise RuntimeError(f"{self.config.name} correlates alerts over its own broker, and runs none")
        partners = {c.partner for c in self._contracts}
        with self._lock:
            ended = self._alert_readers - partners  # a contract ended: its partner reads my alerts no more
            self._alert_readers -= ended
            readers = set(self._alert_readers)
        if ended:
            self.broker.grant(self.broker_grants(), readers=readers)
        if self.correlation is None:
            window_s, alert, lateness_s = self._alerts()
            self.correlation = Correlation(self.config.name, self.broker.url, self.broker.password, window_s=window_s, alert=alert,
                                           bound_s=self.config.availability_bound_s, tls=self.broker.tls, lateness_s=lateness_s)
            self.note("correlation.started", f"{self.config.name} shares its alerts with its partners and correlates theirs "
                      f"(availability bound {self.config.availability_bound_s:g} s)")
        mine = self._correlated_tasks()

        def ask(partner: str) -> Endpoint:
            # Its broker shows the certificate its agent registered.
            return replace(self.ask_alerts(self.endpoint(partner), self.credentials.token(None, "alerts", partner, None)),
                           tls=self.peers.broker_tls(partner))

        self.correlation.step(mine, partners, now, ask)

    def _correlated_tasks(self) -> list[str]:
        """The keys of my tasks whose alerts I share and correlate: those over my main input
        (the query of `--query`), not the tasks of my further inputs' queries; nor a retired
        task, whose windows are all out, so that it holds no window back
        (`spark_agents.correlation.OwnAlerts`). A task not read from the registry yet counts
        until its input is known."""
        me = self.config.name
        inputs = {task_key(t): task_input(t) for t in self.seen.tasks}
        inputs.update({f"{me}.{t.name}": task_input(vars(t)) for t in self.config.tasks})
        retired = {task_key(t) for t in self.seen.tasks if t.get("retired")}
        return [key for key in self._task_ids
                if key.partition(".")[0] == me and key not in retired and inputs.get(key, MAIN) == MAIN]

    def _alerts(self) -> tuple[int, Alert, int]:
        """The window, the `alert` and the least lateness of the query of my main input's
        tasks, which correlation needs; RuntimeError when they run several, or one that
        declares no alerts."""
        from spark_agents.query import bind_task

        tasks = [t for t in self.config.tasks if task_input(vars(t)) == MAIN]
        queries = {t.query for t in tasks}
        bound = [bind_task(self.config.queries or {}, t.name, t.query, t.params)[:2] for t in tasks]
        windows = {definition.align_s(params) for definition, params in bound}
        if len(queries) != 1 or len(windows) != 1:
            raise RuntimeError(f"{self.config.name} correlates the alerts of one query over one window; its main input's tasks run "
                               f"{', '.join(sorted(map(str, queries))) or 'none'} over windows of {sorted(map(str, windows))} s")
        definition = bound[0][0]
        window_s = windows.pop()
        if definition.alert is None or window_s is None:
            raise RuntimeError(f"{self.config.name} correlates alerts: its main input's query must declare `alert` and `align`")
        return window_s, definition.alert, min(definition.lateness_s(params) for _, params in bound)

    def alerts_credentials_to_caller(self, token: str | None) -> dict[str, str]:
        """The credentials of my broker with which a contract partner reads the alerts I share:
        the caller shows the registry's token (purpose `alerts`). LookupError when I share
        none; `Refused` when my last read of my contracts has none in force with it."""
        if not self.config.correlate or self.broker is None:
            raise LookupError(f"{self.config.name} shares no alerts")
        caller = self.credentials.verify(token, "alerts", None, None).caller
        if caller not in {c.partner for c in self._contracts}:
            raise Refused(f"{self.config.name} has no contract in force with {caller}")
        with self._lock:
            self._alert_readers.add(caller)
            readers = set(self._alert_readers)
        if self.broker.grant(self.broker_grants(), readers=readers):
            self.note("alerts.shared", f"let {caller} read {self.config.name}'s alerts")
        return self.broker.credentials(caller)

    def endpoint(self, participant: str) -> str:
        return self.peers.endpoint(participant)

    def rotate_key(self) -> str:
        """A new registry key for this participant, used from now on and kept in the key file;
        the old one stops working at once."""
        rotated = self.client.rotate_key(self.config.name)["api_key"]
        self.client.use_key(rotated)
        self.credentials.forget_tokens()  # they carry the old key's mark: partners refuse them now
        write_key(self.config.workdir / KEY_FILE, rotated)
        self.note("participant.key_rotated", f"{self.config.name} rotated its registry key; {self.config.workdir / KEY_FILE} holds the new one")
        return rotated

    def release_to_caller(self, token: str | None, key: str, epoch: int) -> bytes:
        """`release` to whoever the registry's token says calls (TokenRefused if none), one
        handover at a time; the token is checked before the wait, so no caller the registry
        does not vouch for holds up a handover."""
        caller = self.credentials.verify(token, "handover", key, epoch).caller
        with self._handover_lock:
            return self.release(key, epoch, caller)

    def release(self, key: str, epoch: int, to: str) -> bytes:
        """Hand the checkpoint of `key` to `to`, once the registry says it hosts the task at `epoch`.

        The task is looked up in the registry when this agent does not know it (it restarted
        after a SIGKILL between stopping the task and its new host fetching it, say): the
        checkpoint on disk is what the new host needs, whatever this process remembers."""
        task_id = self._task_ids.get(key)
        if task_id is None:
            found = [t for t in self.client.tasks(host=to) if task_key(t) == key]
            if not found:
                raise handover.HandoverNotReady(f"{key} is not known here, and the registry does not place it at {to}")
            task_id = self._task_ids[key] = found[0]["id"]
        current = self.client.request("GET", f"/tasks/{task_id}")
        if current["host"] != to or current["epoch"] != epoch:
            raise Refused(f"the registry gives {key} to {current['host']} at epoch {current['epoch']}, not to {to} at {epoch}")
        self._release_locally(key, epoch)
        with self._lock:
            if key in self.hosting() or key in self._stopping:
                raise handover.HandoverNotReady(f"{key} is still running here")
            data = handover.pack(self.checkpoint_dir(key))
        self.note("task.handed_over", f"handed {key} over to {to} at epoch {epoch} ({len(data)} bytes)")
        return data

    # Measurement

    def measure(self, here: dict[str, float] | None = None) -> tuple[float, dict[str, float], CostFunction, float]:
        """My load, per task and in total. A task that has just arrived and has no load
        measured here yet counts with the load its previous host reported: what the offer
        that brought it said. `here`: the loads measured here (`host.loads()`), if read already."""
        loads = dict(self.host.loads() if here is None else here)
        for key in self.host.running():
            if key not in loads:
                loads[key] = self._reported.get(key, 0.0)
        load = sum(loads.values())
        cost = self.host.cost_function()
        return load, loads, cost, self.reference_price()

    def reference_price(self, contracts: list | None = None) -> float:
        if self.config.reference_price is not None:
            return self.config.reference_price
        prices = [c.price_min for c in (contracts if contracts is not None else self._contracts)]
        return min(prices) if prices else 1.0

    def heartbeat(self) -> None:
        load, loads, cost, price = self.measure()
        threshold = cost.threshold(price)
        report = {
            "load": load,
            "threshold": threshold if threshold != float("inf") else None,
            "marginal_cost": {"at_load": cost.marginal(load), "reference_price": price},
            "tasks": [{"task_id": self._task_ids[k], "load": v} for k, v in loads.items() if k in self._task_ids],
            "details": {"cost_model": cost.to_dict(), "fallback": cost.fallback_used, "host": self.host.status()},
        }
        acknowledged = sorted(self.reads.acknowledge)
        self._beat_at = self.clock()
        answer = self._send_heartbeat({**report, "acknowledged": acknowledged})
        self.last_report, self.last_loads = report, loads
        self.reads.sent(acknowledged)
        self.reads.noticed(answer.get("changes", []))
        self.seen.partners = answer.get("partners", {})

    def mechanism(self) -> None:
        """One turn of the participant's state machine (`bpm.agent.machine`): what it asks for, done."""
        self.decide(Tick(self.clock()))
        memory = self.machine.mechanism.split_memory()
        if memory != self._split_memory:
            write_private(self.config.workdir / SPLITS_FILE, json.dumps(memory))
            self._split_memory = memory

    def _remembered_splits(self) -> dict:
        """The machine's memory of splits on refusals as this participant's last run left it
        in its own folder (a restart must not split again what it had bounded)."""
        path = self.config.workdir / SPLITS_FILE
        if path.exists():
            try:
                self.decide(SplitsRemembered(json.loads(path.read_text())))
            except ValueError as exc:  # includes a file that is not JSON
                self.note("agent.memory_unreadable", f"{path}: {exc}; splits on refusals are counted afresh")
        return self.machine.mechanism.split_memory()

    def tasks_changed(self) -> None:
        self.decide(TasksChanged(self.clock()))

    def decide(self, event: Event) -> None:
        """Give the state machine `event` and carry out what it answers, and what that calls
        for in turn: the one way the mechanism's events reach the participant's machine
        (HA's observations reach it from `HADuties.act`)."""
        todo = deque(self.machine.handle(event))
        while todo:
            todo.extend(self._execute(todo.popleft()))

    def _execute(self, instruction: Instruction) -> list[Instruction]:
        """Carry out one instruction of the state machine; returns what it asks for next.

        What the agent writes it reads again before its next period, without waiting for
        the notice of its own change."""
        self.reads.mark({Accept: {"offer", "task"}, Refuse: {"offer"}, End: {"task"}, MakeOffer: {"offer"}}.get(type(instruction), set()))
        match instruction:
            case Contracts():
                self._refresh_contracts()
            case Gather():
                self._inputs_ended()
                self.decide(Period(self._view()))
            case Accept(offer_id, partner, task_ids, _, price):
                with self.races.lost(f"offer #{offer_id} from {partner} could not be accepted", kind="offer.lost") as lost:
                    accepted = self.client.accept_offer(int(offer_id), [int(t) for t in task_ids], price=price)
                if not lost:
                    self.counts.update(offers_accepted=1, movements_started=len(accepted["accepted_task_ids"]))
                    self.note("offer.accepted", f"accepted tasks {accepted['accepted_task_ids']} from {partner} at {price:.3f}")
            case Refuse(offer_id, partner, reason):
                with self.races.lost(f"offer #{offer_id} from {partner} could not be refused", kind="offer.lost") as lost:
                    self.client.reject_offer(int(offer_id), reason)
                if not lost:
                    self.counts["offers_refused"] += 1
                    self.note("offer.refused", f"refused offer #{offer_id} from {partner}: {reason}")
            case End(m):
                with self.races.lost(f"movement #{m.id} could not be ended", kind="movement.end_refused", reread=("task",)) as lost:
                    self.client.end_movement(int(m.id))
                if not lost:
                    self.counts["movements_ended"] += 1
                    self.note("movement.ended", f"ended movement #{m.id}: task {m.task_ids[0]} returns to {m.origin}")
            case MakeOffer(offer):
                with self.races.lost(f"offer of tasks {list(offer.task_ids)} to {offer.partner}") as lost:
                    made = self.client.offer(int(offer.contract_id), [int(t) for t in offer.task_ids], offer.price_cap, caps=list(offer.caps),
                                             loads=[t.load for t in offer.tasks],
                                             ttl_s=self.config.offer_ttl_s)
                if lost:
                    return []
                self.seen.offers.append(made)  # pending as far as I know: its answer is read when it is no longer
                self.counts["offers_made"] += 1
                self.note("offer.made", f"offered tasks {made['task_ids']} ({offer.load:.3f} load) to {offer.partner} at up to {offer.price_cap:.3f}")
            case Split(task):
                return self.regrain.split(task)
            case Merge(tasks):
                return self.regrain.merge(tasks)
            case Wait(_, message):
                self.note("offer.none", message)
        return []

    def _inputs_ended(self) -> None:
        """Tell the state machine, once for each, whose input has ended among the tasks that run
        here: this participant's own, read on its own broker, and each partner's whose tasks it
        hosts, read on that partner's broker as those tasks read it. A stream has ended when its
        newest record is an end-of-input mark (`JetStreamInput.has_ended`); the tasks of that
        input then drain where they run (`bpm.agent.machine.InputEnded`). Each read runs in a
        thread of its own, and the period that starts it waits for it `END_READ_WAIT_S` at most:
        a partner's broker that is cut off holds no period up (its read ends with the broker's
        timeout, and a later period reads again). A read that fails is tried again at a later period."""
        import nats.errors

        fresh = []
        for origin, source in self._inputs_to_read().items():
            if origin not in self._end_reads:
                fresh.append(in_background(functools.partial(self._has_ended, source), f"bpm-input-end-{origin}"))
                self._end_reads[origin] = fresh[-1]
        futures.wait(fresh, timeout=END_READ_WAIT_S)  # not again for a read an earlier period started
        for origin, read in list(self._end_reads.items()):
            if not read.done():
                continue
            del self._end_reads[origin]
            try:
                read.result()
            except StreamEnded as exc:
                self.decide(InputEnded(self.clock(), str(exc), origin))
            except (BrokerError, nats.errors.Error, OSError, ValueError, TimeoutError) as exc:
                self.note("input.unread", f"whether {origin}'s input has ended could not be read: {type(exc).__name__}: {exc}")

    @staticmethod
    def _has_ended(source: JetStreamInput) -> None:
        """Raises `StreamEnded` when `source`'s input has ended."""
        if source.has_ended():
            raise StreamEnded(f"{source.participant}'s stream has ended (an end-of-input mark is the newest message of {source.location})")

    def _inputs_to_read(self) -> dict[str, JetStreamInput]:
        """Per participant whose tasks run here and whose input has not ended yet, a stream
        input to read it by: for its own, any of its tasks over its key groups; for a partner's,
        what a task of its hosted here reads (with the credentials that task runs with)."""
        me, running, ended = self.config.name, self.host.running(), self.machine.mechanism.ended
        out: dict[str, JetStreamInput] = {}
        for task in self.seen.tasks:
            origin, key = task["origin"], task_key(task)
            if origin in ended or origin in out:
                continue
            if origin == me:
                if self.broker is not None and key_groups(task) is not None:
                    source = self.stream_input(task)
                    if source is not None:
                        out[me] = source
            elif key in running and self._sources.get(key) is not None:
                out[origin] = self._sources[key]
        return out

    def _refresh_contracts(self) -> None:
        """My contracts in force, after bringing those agreed offline into the registry."""
        me = self.config.name
        self.read()
        if self._agree_contracts(self.seen.contracts):
            self.reads.mark(["contract"])
            self.read()
        self._contracts = active_contracts(me, self.seen.contracts, now=self.clock())

    def _agree_contracts(self, contracts: list[dict]) -> bool:
        """Propose or accept the contracts agreed offline that are not active yet; True if one became active."""
        active = [c for c in contracts if c["state"] == "active"]
        partners = {c["proposer"] for c in active} | {c["counterparty"] for c in active}
        if all(t.partner in partners for t in self.config.contracts):
            return False
        me = self.config.name
        present = [p["name"] for p in self.client.participants()]
        activated = False
        for step in contract_steps(me, self.config.contracts, contracts, present):
            t = step.terms
            if step.action == "propose":
                made = self.client.propose(t.partner, t.price_min, t.price_max, t.min_duration_s, ha_mode=t.ha_mode)
                self.note("contract.proposed", f"proposed contract #{made['id']} to {t.partner}: [{t.price_min}, {t.price_max}], {t.min_duration_s} s, HA {t.ha_mode}")
            else:
                self.client.contract_action(step.contract_id, "accept")
                self.note("contract.accepted", f"accepted contract #{step.contract_id} with {t.partner}: the terms agreed offline")
                activated = True
        return activated

    def _view(self) -> View:
        """What I see at a period, for the state machine (`bpm.agent.view.see`): my load, the
        offers made to me, the movements I may end, the tasks I may offer; the answers to my
        offers since the last period go to the machine first."""
        me = self.config.name
        now = self.clock()
        here = self.host.loads()
        load, loads, cost, _ = self.measure(here)
        self.read()
        offered = {o["id"]: self.client.tasks(host=o["from"]) for o in offers_to_answer(me, self.seen.offers, now, self._contracts)}
        view, answers = see(Read(
            me=me, now_s=now, load=load, loads=loads, measured=here, cost=cost, contracts=self._contracts, records=self.seen.contracts,
            offers=self.seen.offers, movements=self.seen.movements, tasks=self.seen.tasks, partners=self.seen.partners, offered=offered,
            unrunnable=self._unrunnable(t for tasks in offered.values() for t in tasks), rising=self.host.rising(), running=self.host.running(),
            hosting=self.hosting(), ha=self.ha is not None, modes=self.ha.modes if self.ha is not None else None, pass_on=self.config.pass_on,
            fixed_cost=self.config.fixed_cost or 0.0, answered=self._answered,
        ))
        for offer_id, answer in answers:
            self._answered.add(offer_id)
            self.decide(answer)
            if answer.expired:
                self.note("offer.expired", f"my offer #{offer_id} to {answer.partner} expired unanswered: my next offers try my other partners first, "
                          f"until {answer.partner} answers one")
        return view

    # Status

    def status(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "steps": self.steps,
            "errors": self.errors,
            "races": self.races.count,
            "running": sorted(self.host.running()),
            "warming_up": self.machine.mechanism.warming(self.clock()),
            "released": dict(self._released),
            "last_report": self.last_report,
            "partners": dict(self.seen.partners),
            "unread_changes": self.reads.unread(),
            "ha": self.ha.status() if self.ha is not None else None,
            "correlation": self.correlation.status() if self.correlation is not None else None,
            "records": [r.__dict__ for r in list(self.records)[-50:]],
        }
