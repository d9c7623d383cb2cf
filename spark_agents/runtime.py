"""Running one participant as a process: its Spark host, its agent loop and its HTTP endpoint."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bpm_http.client import RegistryClient, RegistryError
from bpm.costs import CostFunction
from bpm.query import Params, Query, QueryError
from spark_agents.agent import KEY_FILE, Agent, AgentConfig, write_key
from spark_agents.query import bind_task
from spark_agents.tls import OwnCertificate
from bpm.load import default_load_window_s, default_startup_s, demand, scaled_to_process, steady_window_start, still_rising

if TYPE_CHECKING:
    from spark_agents.broker.access import OwnBroker
    from spark_agents.broker.results import RegistryEpoch
    from spark_agents.broker.source import JetStreamInput
    from spark_agents.broker.inputs import TaskInput

log = logging.getLogger("bpm.agent")

class SparkTasks:
    """The agent's view of a `SparkHost`: a task names its query (`queries`, by name) and its
    parameters travel as the registry's JSON (the query's own, and `trigger_s`).

    The `ha_*` methods carry out the agent's HA duties (`spark_agents.ha_agent`) with the
    building blocks of `spark_agents.ha.roles`.
    """

    def __init__(self, host, trigger_s: float, cost_model: CostFunction | None = None, load_window_s: float | None = None,
                 startup_s: float | None = None, queries: Mapping[str, Query] | None = None) -> None:
        self.host = host
        self.queries = dict(queries or {})
        self.trigger_s = trigger_s
        self.cost_model = cost_model
        self.load_window_s = load_window_s or default_load_window_s(trigger_s)
        # A task's first batches here are its start-up, not its load.
        self.startup_s = default_startup_s(trigger_s) if startup_s is None else startup_s
        self.min_window_s = self.load_window_s / 2
        self._steady: dict[str, float] = {}  # the loads of the last window that saw one set of tasks
        self._rising: set[str] = set()  # of those, the tasks whose input began within that window (`rising`)
        self._input_from: dict[tuple[str, float], float] = {}  # (task, when it started here) -> its first batch with input
        self._input_read_s = 0.0  # the latest end of a batch `_input_within` has read
        self._duties: dict[str, Any] = {}  # task -> PrimaryDuties
        self._replicas: dict[str, Any] = {}  # task -> the held-back sink of an active-standby replica
        self._sinks: dict[str, Any] = {}  # task -> the output fence's sink it runs with
        # task key -> the registry's newest epoch of it, which bounds the claims its fence believes (`BrokerFence`)
        self.registry_epoch: RegistryEpoch | None = None

    def bind(self, task_id: str, query: str | None, params: Mapping[str, Any]) -> tuple[Query, Params, float]:
        """The query task `task_id` runs, its parameters and its trigger interval, from its
        record (`spark_agents.query.bind_task`; the trigger interval defaults to this host's)."""
        definition, bound, trigger_s = bind_task(self.queries, task_id, query, params)
        return definition, bound, self.trigger_s if trigger_s is None else trigger_s

    def start_task(self, task_id: str, source: JetStreamInput, checkpoint_dir: Path, params: Mapping[str, Any], epoch: int, *,
                   query: str | None = None) -> None:
        """Start (resume) a task of query `query` over its share of a broker stream, its output
        through the output fence on the origin's broker at `epoch`."""
        from spark_agents.broker.results import broker_sink, final_bound

        definition, bound, trigger_s = self.bind(task_id, query, params)
        sink = broker_sink(source.connection(), task_id, epoch, self.registry_epoch, final_bound(source, definition.lateness_s(bound)))
        sink.until_s = source.until_s
        self._sinks[task_id] = sink
        self.host.start_task(task_id, source, checkpoint_dir, definition, bound, trigger_s=trigger_s, sink=sink)

    # High availability (spark_agents.ha_agent)

    def ha_start_duties(self, task_id: str, mode: str, stream: TaskInput, consumer: str, *,
                        query: str | None, params: dict[str, Any], interval_s: float, ship) -> None:
        from spark_agents.ha.roles import PrimaryDuties

        definition, bound, _ = self.bind(task_id, query, params)
        duties = PrimaryDuties(self.host, task_id, mode, stream, consumer, query=definition, params=bound, interval_s=interval_s, ship=ship)
        self._duties[task_id] = duties.start()

    def ha_stop_duties(self, task_id: str, release: bool) -> None:
        duties = self._duties.pop(task_id, None)
        if duties is None:
            return
        duties.stop()
        if release:
            duties.stream.release(duties.consumer)

    def ha_duties_status(self, task_id: str) -> dict[str, Any]:
        d = self._duties.get(task_id)
        if d is None:
            return {}
        return {"acked": d.acked, "rounds": d.rounds, "failures": d.failures, "shipped_bytes": d.shipped_bytes, "last_error": d.last_error}

    def ha_start_replica(self, task_id: str, stream: TaskInput, checkpoint_dir: Path, params: dict[str, Any], *, query: str | None = None) -> None:
        from spark_agents.ha.roles import start_replica

        definition, bound, trigger_s = self.bind(task_id, query, params)
        self._replicas[task_id] = start_replica(self.host, task_id, stream, definition, bound, trigger_s=trigger_s, checkpoint_dir=checkpoint_dir)

    def ha_stop_replica(self, task_id: str) -> None:
        if self._replicas.pop(task_id, None) is not None:
            self.host.stop_task(task_id, timeout_s=self.STOP_WAIT_S)

    def ha_take_over(self, task_id: str, mode: str, *, epoch: int, stream: TaskInput, consumer: str,
                     failed_consumer: str | None, query: str | None, params: dict[str, Any], checkpoint_dir: Path, backup) -> dict[str, Any]:
        from spark_agents.ha.roles import take_over

        definition, bound, trigger_s = self.bind(task_id, query, params)
        took = take_over(self.host, task_id, mode, epoch=epoch, stream=stream, consumer=consumer, failed_consumer=failed_consumer,
                         query=definition, params=bound, trigger_s=trigger_s, checkpoint_dir=checkpoint_dir,
                         backup=backup, replica=self._replicas.pop(task_id, None))
        return {"start_position": took.start_position, "promoted_rows": took.promoted_rows, "takeover_s": round(took.started_s, 3)}

    def ha_first_output(self, task_id: str, since: float) -> float | None:
        """When the task first finished a batch at or after `since` (its output is written by then)."""
        times = [s.end_s for s in self.host.recorder.samples(since_s=since) if s.task_id == task_id and s.end_s >= since]
        return min(times, default=None)

    # How long a stop waits for the running batch to finish (see SparkHost.stop_task); after
    # that the batch is abandoned uncommitted, and its new host runs it again from the
    # checkpoint (same batch id, same output file: nothing twice).
    STOP_WAIT_S = 60.0

    def stop_task(self, task_id: str) -> Path:
        self._sinks.pop(task_id, None)
        return self.host.stop_task(task_id, timeout_s=self.STOP_WAIT_S)

    def end_output(self, task_id: str, until_s: int | None) -> None:
        sink = self._sinks.get(task_id)
        if sink is not None:
            sink.until_s = until_s

    def running(self) -> set[str]:
        return set(self.host.running())

    def starting(self) -> set[str]:
        return set(self.host.starting())

    def close(self) -> None:
        for task_id in list(self._duties):
            self.ha_stop_duties(task_id, release=False)

    def loads(self) -> dict[str, float]:
        """What each running task needs: its share of the process CPU over the load window,
        scaled up by how far its batches fall behind their trigger (`bpm.load.demand`).

        The window starts after the last change of the tasks running here and after every
        task's start-up (`steady_window_start`). While that leaves less than half a window,
        the loads of the last such window stand for the tasks that stayed, and a task that
        has just started has no load yet (the agent carries over what its previous host
        reported). So a participant never reports the CPU of tasks that left, spread over
        those that stayed, nor a new task's first batches as its load.
        """
        now = time.time()
        tasks = self.host.tasks()
        running = {t.task_id for t in tasks if t.state == "running"}
        start = steady_window_start(now, self.load_window_s, [t.started_s for t in tasks if t.task_id in running],
                                    [t.stopped_s for t in tasks if t.stopped_s is not None], self.startup_s)
        if now - start >= self.min_window_s:
            got = scaled_to_process(self.host.loads(window_s=now - start), list(self.host.intervals), start)
            triggers = {t.task_id: t.trigger_s for t in tasks}
            self._steady = demand(got, self.host.recorder.samples(since_s=start), triggers)
            self._rising = self._input_within(tasks, running, start)
        return {task: load for task, load in self._steady.items() if task in running}

    def rising(self) -> set[str]:
        """The running tasks whose load, as `loads` last measured it, is still rising
        (`bpm.load.still_rising`). The agent does not offer them: they would be priced at a
        part of what they need (docs/benchmarks.md, "Runs at 1a426e8")."""
        return self._rising & self.running()

    def _input_within(self, tasks: list, running: set[str], start_s: float) -> set[str]:
        """Of `running`, the tasks still rising over a window from `start_s`; remembers each
        task's first batch with input since it started here."""
        started = {t.task_id: t.started_s for t in tasks if t.task_id in running}
        self._input_from = {k: v for k, v in self._input_from.items() if started.get(k[0]) == k[1]}
        unknown = {task: s for task, s in started.items() if (task, s) not in self._input_from}
        if unknown:
            # Samples already read are not read again (a task never fed stays unknown), but
            # a listener may report a batch late: a minute's overlap.
            since = max(min(unknown.values()), self._input_read_s - 60.0)
            for sample in self.host.recorder.samples(since_s=since):
                self._input_read_s = max(self._input_read_s, sample.end_s)
                s = unknown.get(sample.task_id)
                if s is not None and sample.rows > 0 and sample.start_s >= s:
                    key = (sample.task_id, s)
                    self._input_from[key] = min(sample.start_s, self._input_from.get(key, sample.start_s))
        return {task for task, s in started.items() if still_rising(s, self._input_from.get((task, s)), start_s, self.startup_s)}

    def cost_function(self) -> CostFunction:
        # A fixed model stands in for the fitted one when the operator chose it (--cost-model mm1).
        return self.cost_model or self.host.cost_function()

    def status(self) -> dict[str, Any]:
        status = self.host.status()
        # The fitted curve and per-task details are long; the registry keeps a summary.
        summary = {k: status[k] for k in ("master", "cpus", "utilisation", "cpu_utilisation", "mean_batch_s", "fallback_used", "intervals")}
        summary["tasks"] = [
            {"task_id": t["task_id"], "state": t["state"], "batches": t["batches"], "position": t["position"],
             "watermark_ms": t["watermark_ms"], "backlog": t["backlog"]["pending"]}
            for t in status["tasks"]
        ]
        return summary


def participant_key(registry_url: str, name: str, endpoint: str, workdir: Path, key: str | None, admin_key: str | None) -> str:
    """This participant's key: given, else kept from an earlier run, else obtained by registering.

    A key given (`--key`, `BPM_KEY`) that the registry refuses gives way to the one kept in
    the work folder when the registry accepts that one: the agent rotated its key
    (`POST /key/rotate`) since it was configured, and keeps the new one there."""
    key_file = workdir / KEY_FILE
    kept = key_file.read_text().strip() if key_file.exists() else None
    if key:
        if kept and kept != key and not _is_key_of(registry_url, name, key) and _is_key_of(registry_url, name, kept):
            log.warning("%s: the key given is refused; using the one %s keeps (rotated since)", name, key_file)
            return kept
        return key
    if kept:
        return kept
    if not admin_key:
        raise SystemExit(f"{name} has no key: pass --key, or the operator key (--admin-key / BPM_ADMIN_KEY) to register it")
    with RegistryClient(registry_url, admin_key) as operator:
        try:
            created = operator.add_participant(name, endpoint)
        except RegistryError as exc:
            raise SystemExit(f"cannot register {name}: {exc}; if it exists, pass its --key") from exc
    write_key(key_file, created["api_key"])
    log.info("registered %s at %s", name, endpoint)
    return created["api_key"]


def register_certificate(client: RegistryClient, name: str, pem: str, stop: threading.Event, *, retry_s: float = 2.0) -> None:
    """Register the TLS certificate this agent serves, before it serves: its partners pin it.
    Tried again every `retry_s` while the registry cannot be reached (or until `stop`); a
    certificate the registry refuses is a SystemExit that says why."""
    while not stop.is_set():
        try:
            registered = client.register_certificate(name, pem)
        except RegistryError as exc:
            if exc.status < 500:
                raise SystemExit(f"{name}: the registry refuses its TLS certificate: {exc}") from None
            log.warning("%s: cannot register its TLS certificate yet: %s", name, exc)
        except httpx.HTTPError as exc:
            log.warning("%s: cannot register its TLS certificate yet, the registry does not answer: %s", name, exc)
        else:
            log.info("%s: TLS certificate %s... registered", name, registered["certificate_sha256"][:16])
            return
        stop.wait(retry_s)


def _is_key_of(registry_url: str, name: str, key: str) -> bool:
    """Whether the registry takes `key` as `name`'s (False too when it cannot be asked)."""
    try:
        with RegistryClient(registry_url, key) as client:
            me = client.me()
    except Exception:  # refused, or no answer: not a key to prefer
        return False
    return me.get("role") == "participant" and me.get("name") == name


def priming(config: AgentConfig) -> list[tuple[Query, Params]]:
    """Each query `config` can run, with the parameters of its first own task of that query
    (else the query's defaults): what priming runs. A query whose defaults do not bind (a
    parameter without one) is not primed."""
    out = []
    for name, definition in (config.queries or {}).items():
        own = next((t.params for t in config.tasks if t.query == name), None)
        try:
            out.append((definition, definition.bind(own or {})))
        except QueryError as exc:
            log.info("%s: %s is not primed: %s", config.name, name, exc)
    return out


def run_agent(
    config: AgentConfig,
    *,
    registry_url: str,
    key: str,
    bind_host: str,
    port: int,
    spark_master: str,
    driver_host: str,
    driver_bind: str,
    cpus: float | None,
    trigger_s: float,
    sample_s: float,
    cost_model: CostFunction | None = None,
    broker: OwnBroker | None = None,
    prime_s: float = 0.0,
    tls: OwnCertificate | None = None,
    spark_conf: dict[str, str] | None = None,
) -> None:
    """Run until SIGTERM or SIGINT; then stop every task at a batch boundary and exit.
    With `tls`, the agent serves HTTPS with that certificate, which it registers with the
    registry for its partners to pin (`spark_agents.tls`); without, plain HTTP (`--insecure`).
    With `broker`, the participant's own NATS server runs as long as the agent. With
    `prime_s`, its Spark first runs each query it can run over made-up records, for that
    long in all (`spark_agents.warmup`), before the agent answers or trades. `spark_conf`:
    Spark settings of the operator's (`bpm agent run --spark-conf`), over the agent's own."""
    import uvicorn

    from spark_agents.host import SparkHost
    from spark_agents.hosts import lower_priority, python_first
    from bpm_http.web import KEEP_ALIVE_S
    from spark_agents.server import create_agent_app
    from spark_agents.session import agent_conf, make_session
    from spark_agents.warmup import prime

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    conf = agent_conf(spark_master, spark_conf)
    # Spark's Python processes first within the participant's CPU quota, importing the installed pyspark.
    os.environ["PYSPARK_PYTHON"] = python_first(config.workdir, sys.executable)
    with contextlib.ExitStack() as cleanup:  # undone in reverse, also when a start fails
        if broker is not None:
            broker.start()
            cleanup.callback(broker.stop)
            log.info("%s: broker %s (storage %s)", config.name, broker.url, broker.folder)
        spark = make_session(spark_master, app_name=f"bpm-{config.name}", conf=conf, lean=spark_master.startswith("local"),
                             driver_host=driver_host, bind_address=driver_bind)
        cleanup.callback(spark.stop)
        driver = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
        if driver is not None:
            lower_priority(driver.pid)  # a saturated participant's agent still answers and hands over
        primed = priming(config) if prime_s else []
        for definition, params in primed:
            try:
                ran = prime(spark, prime_s / len(primed), config.workdir / "prime", definition, params)
                log.info("%s: Spark primed with %s: %d batches of made-up records in %g s", config.name, definition.name, ran["batches"], ran["seconds"])
            except Exception as exc:  # Spark's own errors included: its first tasks then pay the warm-up, as unprimed
                log.warning("%s: priming Spark with %s failed, its first tasks will measure its warm-up: %s", config.name, definition.name, exc)
        host = SparkHost(spark, config.workdir, cpus=cpus, interval_s=sample_s)
        host.start_sampling()
        client = cleanup.enter_context(RegistryClient(registry_url, key))
        if tls is not None:
            register_certificate(client, config.name, tls.pem, stop)
        tasks = SparkTasks(host, trigger_s, cost_model, queries=config.queries)
        agent = Agent(config, client, tasks, broker=broker)
        tasks.registry_epoch = agent.registry_epoch
        served_tls = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)} if tls is not None else {}
        server = uvicorn.Server(uvicorn.Config(create_agent_app(agent, host), host=bind_host, port=port, log_level="warning",
                                               timeout_keep_alive=KEEP_ALIVE_S, **served_tls))
        server_thread = threading.Thread(target=server.run, name="bpm-agent-http", daemon=True)
        server_thread.start()
        log.info("%s: agent on %s, Spark %s (driver at %s), registry %s", config.name, config.endpoint, spark_master, driver_host, registry_url)
        try:
            agent.run(stop)
        finally:
            log.info("%s: stopping tasks at batch boundaries", config.name)
            server.should_exit = True
            host.close(stop_tasks=True)
