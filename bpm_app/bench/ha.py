"""High availability of a task under each mode, with a crash of its host mid-stream.

For each mode in turn (one after another, so two Spark processes at a time fit two cores):
the command starts two worker processes, each with its own SparkSession (`local[1]`) and
`TaskHost`: the host `a` and the second participant `b` (`python -m bpm_app.bench.ha --worker`,
orders over an authenticated socket as in `bpm_app.bench.move`), each in a host of its own
(a network namespace, `spark_agents.hosts`) where the machine allows it, else on loopback.
A paced feeder in the command publishes generated Zeek traffic into the task's origin's
stream on a NATS server the command runs on the machine (the origin `o`, which neither
worker is: it outlives the crash; both hosts reach it on the machine's address on their
bridge), and both workers read it and acknowledge it over the network
(`spark_agents.ha.inputs`; as the stream's owner user: who may read what is the agents'
business, tested on its own). `a` runs the task at epoch 1 through the output fence on the
origin's broker and does its mode's duties (`spark_agents.ha.roles`);
`b` is a warm participant that, per mode, does nothing (none, upstream backup), applies the
deltas `a` sends it over the network (passive standby), or runs the replica with its
output held back (active standby). `a` beats into a file; the command watches it.

After a warm-up, the CPU time of both processes (Python and Spark's JVM with its Python
workers, from /proc) and the rows `a` processed are measured over an interval; then `a`'s
host crashes: every process in it is killed with SIGKILL at once. The watcher sees the
heartbeat silent past the timeout and at once tells `b` to take the task over at epoch 2.
The feed goes on for a while, then closes (end mark); `b` drains the stream; the results
on the origin's broker are compared with the plain computation over exactly what was fed.

Figures per mode:

* `overhead_ratio`: CPU seconds of both processes per row `a` processed, with the mode's HA
  work over without it, measured before the failure. The measuring interval is cut into
  slices that alternate between the host's HA duties paused and running (off, on, off,
  on, ...), each ending right after a batch, in the same two processes, so that the noise between process pairs and over time
  (other work on the machine, JIT) cancels: both runs of a pair of processes differ in
  CPU per row by more than the HA work costs. An active standby's replica cannot be paused,
  so its ratio is against the CPU per row of mode none's run instead
  (`overhead_method`); `overhead_ratio_unpaired` gives that figure for every mode, and
  `ha_cpu_s_per_1000_rows` the CPU the HA work itself took (the host's duty rounds and the
  backup's applying of deltas, each on its own thread's clock);
* `detection_s`: from the kill to the detection;
* `recovery_s`: from the kill to the first output written after it (when the origin's
  broker stored the batch), and `recovery_after_detection_s`, the part after the detection;
* `lost_results`, `duplicate_results`, `unexpected_results` against the plain computation;
* `delays`: per window written, when (relative to the kill) and its delay, the time it was
  written minus the time the stream reached the window's end (the first flush of the
  feeder that admitted an event at or past it); the plot shows them per mode.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_agents.hosts import Hosts
from bpm_app.bench.move import PacedFeed, RemoteSide, Side, load_average, own_address, step_limits, traffic
from bpm.ha.decisions import HA_MODES, PRECISE_MODES
from bpm.zeek.definitions import MICROS, QueryParams
from bpm.zeek.generator import TrafficProfile

if TYPE_CHECKING:
    from spark_agents.broker.source import JetStreamInput

ORIGIN = "o"
TASK_ID = f"{ORIGIN}.ha-0"
DETECTION_GOAL_S = 3.0
RECOVERY_GOALS_S = {"active_standby": 1.0, "passive_standby": 5.0}
OVERHEAD_GOALS = {"upstream_backup": 1.05, "passive_standby": 1.15}
BENCH_PARAMS = QueryParams(window_s=10, min_connections=40, min_ports=6, lateness_s=5)
CAUGHT_UP_MESSAGES = 256  # about four flushes of the feeder: one message per key group that got rows


class HABenchError(RuntimeError):
    """The benchmark could not run to the end (a process failed, or a step passed its time limit)."""


@dataclass(frozen=True)
class HASettings:
    """What one run of the benchmark does.

    Attributes:
        modes: the HA modes to run, in order (the overhead ratio needs "none" among them).
        master: Spark master of each worker's session.
        trigger_s: the task's processing-time trigger.
        flush_s: how often the feeder writes a stream file.
        rate: connections per second of event time in the generated traffic.
        speedup: event time per second of wall time.
        seed: seed of the generated traffic.
        copy_interval_s: how often passive standby ships a delta checkpoint.
        ack_interval_s: how often the other modes acknowledge the stream.
        heartbeat_s: how often the host beats.
        detect_timeout_s: silence after which the host counts as failed.
        warmup_s: run time before measuring.
        measure_s: the measuring interval before the kill.
        slices: how many slices the interval is cut into, alternating HA duties off and on (even).
        after_s: feeding time after the kill, before the stream closes.
        timeout_s: limit of the whole run; step_timeout_s: of any single step.
        lean: run each local driver with `spark_agents.session.LEAN_JVM_OPTIONS`, as agents on a local master do.
        extra_conf: further Spark settings of both sessions.
        params: the monitoring query's parameters (10 s windows: a result about every second of wall time).
        hosts: run `a` and `b` each in a host of its own (a network namespace, `spark_agents.hosts`)
            where the machine allows it: the failure is then a crash of `a`'s host.
    """

    modes: tuple[str, ...] = HA_MODES
    master: str = "local[1]"
    trigger_s: float = 1.0
    flush_s: float = 0.25
    rate: float = 100.0
    speedup: float = 10.0
    seed: int = 0
    copy_interval_s: float = 2.0
    ack_interval_s: float = 1.0
    heartbeat_s: float = 0.25
    detect_timeout_s: float = 3.0
    warmup_s: float = 10.0
    measure_s: float = 40.0
    slices: int = 8
    after_s: float = 10.0
    timeout_s: float = 1800.0
    step_timeout_s: float = 180.0
    lean: bool = True
    extra_conf: tuple[tuple[str, str], ...] = ()
    params: QueryParams = field(default_factory=lambda: BENCH_PARAMS)
    hosts: bool = True

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in HA_MODES]
        if unknown or not self.modes:
            raise ValueError(f"modes must be among {', '.join(HA_MODES)}; got {', '.join(self.modes) or 'none'}")
        if min(self.trigger_s, self.flush_s, self.rate, self.speedup, self.copy_interval_s, self.ack_interval_s,
               self.heartbeat_s, self.detect_timeout_s, self.measure_s, self.timeout_s, self.step_timeout_s) <= 0:
            raise ValueError("intervals, rates and time limits must be positive")
        if self.warmup_s < 0 or self.after_s < 0:
            raise ValueError("warm-up and after-failure times must not be negative")
        if self.slices < 2 or self.slices % 2:
            raise ValueError("the measuring interval needs an even number of slices, at least 2")
        if self.heartbeat_s >= self.detect_timeout_s:
            raise ValueError("the heartbeat interval must be shorter than the detection timeout")

    def spark_conf(self) -> dict[str, str]:
        conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
        if self.lean and self.master.startswith("local"):
            from spark_agents.session import LEAN_JVM_OPTIONS, _log_config

            # The whole option string: a conf entry replaces make_session's default (the log configuration).
            conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_log_config()} {LEAN_JVM_OPTIONS}"
        return {**conf, **dict(self.extra_conf)}

    def profile(self) -> TrafficProfile:
        return TrafficProfile(rate=self.rate)


# -- one participant: a warm session, a task host and the HA roles -----------------------------


def _process_cpu_seconds(jvm_pid: int | None) -> float:
    from spark_agents.metrics import spark_cpu_seconds

    return (spark_cpu_seconds(jvm_pid) if jvm_pid is not None else None) or time.process_time()


def _delta_shipper(inbox: tuple[str, int, str]) -> Callable[[bytes], int | None]:
    """Send passive-standby deltas to the backup's socket (`inbox`: address, port and key); returns its acknowledged position."""
    conn = Client((inbox[0], inbox[1]), authkey=bytes.fromhex(inbox[2]))
    lock = threading.Lock()

    def ship(data: bytes) -> int | None:
        with lock:
            conn.send_bytes(data)
            status, value = conn.recv()
        if status != "ok":
            raise RuntimeError(f"the backup refused a delta: {value}")
        return value

    return ship


class HASide(Side):
    """A worker process's participant for this benchmark: `Side` plus the HA roles of `spark_agents.ha`.

    Every method takes and returns plain data, so the command calls them across the socket.
    """

    def __init__(self, name: str, root: str | Path, master: str, conf: dict[str, str]) -> None:
        super().__init__(name, root, master, conf)
        gateway = getattr(self.spark.sparkContext, "_gateway", None)
        proc = getattr(gateway, "proc", None)
        self._jvm_pid = proc.pid if proc is not None else None
        self._duties: dict[str, Any] = {}
        self._sinks: dict[str, Any] = {}
        self._backups: dict[str, Any] = {}
        self._beat = None
        self._inbox: Listener | None = None
        self._warm_up()

    def _warm_up(self) -> None:
        """Run the query through the broker source over a small input first, as a participant's
        JVM and Python workers that host other tasks have: a cold JVM's first batches are many
        times slower (class loading, code generation, JIT), and so is the first read of a
        Python data source (its worker processes start and import pyarrow and nats), which
        would be measured as the cost of a takeover or of a mode. `bpm pipeline run`'s
        function does it, on a NATS server of the run's own."""
        from bpm.zeek.generator import generate
        from spark_agents.pipeline import run_pipeline

        run_pipeline(self.spark, generate(TrafficProfile(duration_s=40.0, rate=100.0), seed=99), BENCH_PARAMS, work_dir=self.root)

    @staticmethod
    def _stream(source: JetStreamInput):
        """The task's key groups of the origin's stream, acknowledged on the origin's `Retention`."""
        from spark_agents.broker.retention import Retention
        from spark_agents.ha.inputs import OwnAcks, TaskInput

        return TaskInput(source, OwnAcks(Retention(source.connection(), source.participant), source.prefix))

    def _start_duties(self, task_id: str, mode: str, source: JetStreamInput, params: QueryParams,
                      interval_s: float, ship: Callable[[bytes], Any] | None = None) -> None:
        from spark_agents.ha.roles import PrimaryDuties, consumer_name

        duties = PrimaryDuties(self.host, task_id, mode, self._stream(source), consumer_name(task_id, self.name),
                               params=params, interval_s=interval_s, ship=ship)
        self._duties[task_id] = duties.start()

    def beat(self, path: str, interval_s: float) -> None:
        """Start beating into `path`."""
        from spark_agents.ha.heartbeat import HeartbeatFile

        self._beat = HeartbeatFile(path, interval_s).start()

    def delta_inbox(self, task_id: str) -> tuple[str, int, str]:
        """Be the passive backup of `task_id`: take deltas on a socket at this worker's address; returns its address, port and key."""
        from spark_agents.ha.roles import PassiveBackup

        backup = self._backups[task_id] = PassiveBackup(self.root / "backups" / task_id)
        key = secrets.token_bytes(32)
        self._inbox = listener = Listener((own_address(), 0), authkey=key)

        def serve() -> None:
            try:
                conn = listener.accept()
            except OSError:
                return
            with conn:
                while True:
                    try:
                        data = conn.recv_bytes()
                    except (EOFError, OSError):
                        return
                    try:
                        conn.send(("ok", backup.apply(data).ack_position))
                    except Exception as exc:  # noqa: BLE001 - the primary keeps the delta and retries
                        conn.send(("error", f"{type(exc).__name__}: {exc}"))

        threading.Thread(target=serve, name="bpm-ha-inbox", daemon=True).start()
        return listener.address[0], listener.address[1], key.hex()

    def start_primary(self, mode: str, task_id: str, source: JetStreamInput, params: dict[str, int],
                      trigger_s: float, epoch: int, interval_s: float, inbox: tuple[str, int, str] | None) -> None:
        """Host the task at `epoch` with its mode's duties (`inbox`: the passive backup's socket)."""
        from spark_agents.ha.roles import start_primary

        query = QueryParams(**params)
        ship = None if inbox is None else _delta_shipper(inbox)
        self._sinks[task_id] = start_primary(self.host, task_id, self._stream(source), epoch, query,
                                             trigger_s=trigger_s, checkpoint_dir=self.checkpoint_dir(task_id))
        self._start_duties(task_id, mode, source, query, interval_s, ship)

    def start_replica(self, task_id: str, source: JetStreamInput, params: dict[str, int], trigger_s: float,
                      interval_s: float) -> None:
        """Run the active-standby replica: output held back, the stream acknowledged after its own batches."""
        from spark_agents.ha.roles import start_replica

        query = QueryParams(**params)
        self._sinks[task_id] = start_replica(self.host, task_id, self._stream(source), query,
                                             trigger_s=trigger_s, checkpoint_dir=self.checkpoint_dir(task_id))
        self._start_duties(task_id, "active_standby", source, query, interval_s)

    def take_over(self, mode: str, task_id: str, source: JetStreamInput, params: dict[str, int],
                  trigger_s: float, epoch: int, failed: str, interval_s: float) -> dict[str, Any]:
        """Take the task over from the failed participant `failed` at `epoch`."""
        from spark_agents.ha.roles import consumer_name, take_over

        began = time.perf_counter()
        query = QueryParams(**params)
        stream = self._stream(source)
        newest = stream.newest()
        took = take_over(self.host, task_id, mode, epoch=epoch, stream=stream,
                         consumer=consumer_name(task_id, self.name), failed_consumer=consumer_name(task_id, failed),
                         params=query, trigger_s=trigger_s, checkpoint_dir=self.checkpoint_dir(task_id),
                         backup=self._backups.get(task_id), replica=self._sinks.get(task_id))
        self._sinks[task_id] = took.sink
        if mode in ("none", "upstream_backup"):
            self._start_duties(task_id, mode, source, query, interval_s)
        return {"takeover_s": time.perf_counter() - began, "returned_at": time.time(), "start_position": took.start_position,
                "replayed_messages": None if took.start_position is None else newest - took.start_position,
                "promoted_rows": took.promoted_rows}

    def set_duties(self, task_id: str, running: bool) -> None:
        """Pause or resume the task's HA duty rounds."""
        paused = self._duties[task_id].paused
        paused.clear() if running else paused.set()

    def backlog_messages(self, task_id: str) -> int:
        """Messages of the stream the task has not taken yet."""
        task = next(t for t in self.host.tasks() if t.task_id == task_id)
        return int(self.host.backlog(task)["pending"])

    def measure(self, task_id: str) -> dict[str, float]:
        """This process's CPU seconds so far (Python and its Spark JVM) and the input rows the task processed here."""
        rows = sum(t.rows for t in self.host.tasks() if t.task_id == task_id)
        return {"time": time.time(), "cpu_s": _process_cpu_seconds(self._jvm_pid), "rows": float(rows)}

    def measure_at_batch(self, task_id: str, timeout_s: float) -> dict[str, float]:
        """`measure` right after the task's next batch ends: the rows counted so far are then exactly
        those the CPU so far processed (between batches a count would be off by a whole batch)."""
        task = next(t for t in self.host.tasks() if t.task_id == task_id)
        seen = task.batches
        deadline = time.monotonic() + timeout_s
        while task.batches == seen:
            if time.monotonic() > deadline:
                raise HABenchError(f"{self.name}: no batch of {task_id} ended within {timeout_s:.0f} s")
            time.sleep(0.002)
        return self.measure(task_id)

    def ha_status(self, task_id: str) -> dict[str, Any]:
        duties, sink = self._duties.get(task_id), self._sinks.get(task_id)
        backup = self._backups.get(task_id)
        return {
            "acked": duties.acked if duties else None,
            "duty_rounds": duties.rounds if duties else 0,
            "duty_failures": duties.failures if duties else 0,
            "duty_error": duties.last_error if duties else None,
            "shipped_bytes": duties.shipped_bytes if duties else 0,
            "pack_retries": duties.shipper.pack_retries if duties and duties.shipper else 0,
            "duty_cpu_s": round(duties.cpu_s, 4) if duties else 0.0,
            "apply_cpu_s": round(backup.cpu_s, 4) if backup else 0.0,
            "rows": sum(t.rows for t in self.host.tasks() if t.task_id == task_id),
            "written_rows": sink.written if sink else 0,
            "dropped_rows": sink.dropped if sink else 0,
            "backup_committed": backup.applied.committed if backup and backup.applied else None,
        }

    def close(self) -> None:
        for duties in self._duties.values():
            duties.stop()
        if self._beat is not None:
            self._beat.stop()
        if self._inbox is not None:
            self._inbox.close()
        super().close()


# -- pure parts ----------------------------------------------------------------------------------


def overhead_ratios(cpu_per_row: dict[str, float | None]) -> dict[str, float | None]:
    """Each mode's CPU per row over mode none's (None without a baseline or a figure)."""
    base = cpu_per_row.get("none")
    return {mode: (round(v / base, 3) if v is not None and base else None) for mode, v in cpu_per_row.items()}


def sliced_cpu_per_row(marks: list[dict[str, dict[str, float]]]) -> dict[str, float | None]:
    """CPU seconds of all processes per 1000 rows of the host ("a"), over the odd slices (duties
    off) and the even ones (on), from the measurements at the slices' boundaries."""
    totals = {"off": [0.0, 0.0], "on": [0.0, 0.0]}
    for i, (before, after) in enumerate(zip(marks, marks[1:])):
        phase = totals["on" if i % 2 else "off"]
        phase[0] += sum(after[side]["cpu_s"] - before[side]["cpu_s"] for side in after)
        phase[1] += after["a"]["rows"] - before["a"]["rows"]
    return {phase: (round(1000 * cpu / rows, 4) if rows > 0 else None) for phase, (cpu, rows) in totals.items()}


def slice_figures(marks: list[dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    """Per slice: whether the duties ran, its length, rows, and CPU seconds per 1000 rows (the noise to judge a ratio by)."""
    figures = []
    for i, (before, after) in enumerate(zip(marks, marks[1:])):
        rows = after["a"]["rows"] - before["a"]["rows"]
        cpu = sum(after[side]["cpu_s"] - before[side]["cpu_s"] for side in after)
        figures.append({"duties": "on" if i % 2 else "off", "s": round(after["a"]["time"] - before["a"]["time"], 2),
                        "rows": int(rows), "cpu_s_per_1000_rows": round(1000 * cpu / rows, 4) if rows > 0 else None})
    return figures


def goals(mode: dict[str, Any]) -> dict[str, bool | None]:
    """Which of the benchmark's goals a mode's figures meet (None: the goal does not apply)."""
    name = mode["mode"]
    detection = mode.get("detection_s")
    after = mode.get("recovery_after_detection_s")
    ratio = mode.get("overhead_ratio")
    return {
        "detection_within_3s": None if detection is None else detection <= DETECTION_GOAL_S,
        "recovery_after_detection": None if name not in RECOVERY_GOALS_S or after is None else after < RECOVERY_GOALS_S[name],
        "overhead": None if name not in OVERHEAD_GOALS or ratio is None else ratio < OVERHEAD_GOALS[name],
        "precise": None if name not in PRECISE_MODES else mode["lost_results"] == 0 and mode["duplicate_results"] == 0,
    }


def _emissions(batches: list, reached: list[tuple[float, int]], kill_at: float) -> tuple[list[dict[str, Any]], float | None]:
    """Per window written (`batches`: the task's result batches on the origin's broker): when
    (relative to the kill), by which epoch, its delay after the feeder's flush that reached
    its end (`reached`: `PacedFeed.reached`); and the first write after the kill."""
    import bisect

    times, newest = [t for t, _ in reached], [us for _, us in reached]

    def stream_reached(window_end: int) -> float | None:
        i = bisect.bisect_left(newest, window_end * MICROS)  # the newest event time never moves back
        return times[i] if i < len(times) else None

    points = []
    first_after = None
    for batch in batches:
        if batch.at > kill_at and (first_after is None or batch.at < first_after):
            first_after = batch.at
        for window_end in sorted({r.window_end for r in batch.rows}):
            at = stream_reached(window_end)
            points.append({"t": round(batch.at - kill_at, 3), "delay_s": None if at is None else round(batch.at - at, 3),
                           "window_end": window_end, "epoch": batch.epoch})
    points.sort(key=lambda p: p["t"])
    return points, first_after


# -- the run -------------------------------------------------------------------------------------


def run_mode(mode: str, settings: HASettings, work_dir: str | Path, progress: Callable[[str], None] = lambda what: None) -> dict[str, Any]:
    """One mode: start the origin's broker and both participants, feed, measure, kill the host,
    fail over, drain, check the results."""
    from bpm.zeek.reference import compute
    from spark_agents.broker.results import broker_outputs, read_results
    from spark_agents.broker.server import NatsServer, User
    from spark_agents.broker.source import JetStreamInput
    from spark_agents.broker.stream import Broker, BrokerStream
    from spark_agents.ha.heartbeat import HeartbeatWatcher, read_heartbeat

    root = Path(work_dir) / mode
    began = time.monotonic()
    load_before = load_average()
    limit = step_limits(settings.timeout_s, settings.step_timeout_s, lambda message: HABenchError(f"{mode}: {message}"))

    params = asdict(settings.params)
    heartbeat = root / "heartbeat-a"
    profile = settings.profile()
    owner = User(ORIGIN, secrets.token_urlsafe(16))
    a = b = feed = watcher = server = broker = None
    takeover: dict[str, Any] = {}
    # `a` and `b` are hosts of their own where the machine allows it; the origin's broker is
    # on the machine, which every host reaches (the machine's address on the hosts' bridge).
    hosts = Hosts.open("bench-ha", root / "hosts", cpus=False, say=progress) if settings.hosts else None
    try:
        progress(f"{mode}: starting the origin's broker and two Spark processes")
        broker_address = hosts.net.gateway if hosts is not None and hosts.net is not None else "127.0.0.1"
        server = NatsServer.on_free_ports(ORIGIN, root / ORIGIN / "broker", [owner], host=broker_address).start()
        broker = Broker(server.url, owner.name, owner.password)
        broker.ensure_stream(ORIGIN)  # before any reader: a query's first plan asks for the stream
        source = JetStreamInput(server.url, owner.name, owner.password, ORIGIN)
        b = RemoteSide("b", root, settings.master, settings.spark_conf(), limit(), module="bpm_app.bench.ha", hosts=hosts)
        a = RemoteSide("a", root, settings.master, settings.spark_conf(), limit(), module="bpm_app.bench.ha", hosts=hosts)
        b.wait_ready(limit())
        a.wait_ready(limit())
        inbox = b.call("delta_inbox", TASK_ID, timeout_s=limit()) if mode == "passive_standby" else None
        if mode == "active_standby":
            b.call("start_replica", TASK_ID, source, params, settings.trigger_s, settings.ack_interval_s, timeout_s=limit())
        interval = settings.copy_interval_s if mode == "passive_standby" else settings.ack_interval_s
        a.call("start_primary", mode, TASK_ID, source, params, settings.trigger_s, 1, interval, inbox, timeout_s=limit())
        a.call("beat", str(heartbeat), settings.heartbeat_s, timeout_s=limit())
        feed = PacedFeed(BrokerStream(broker, ORIGIN), settings, profile)  # reads flush_s, speedup, seed and params from the settings
        feed.start()
        a.call("wait_new_batch", TASK_ID, -1, limit(), timeout_s=limit() + 30)
        progress(f"{mode}: warming up")
        time.sleep(settings.warmup_s)
        # Measure a task that keeps up with its input, not one still catching up on a backlog.
        while a.call("backlog_messages", TASK_ID, timeout_s=limit()) > CAUGHT_UP_MESSAGES:
            time.sleep(0.5)

        def fail_over(detected_at: float, last_beat: float | None) -> None:
            takeover["detected_at"] = detected_at
            takeover.update(b.call("take_over", mode, TASK_ID, source, params, settings.trigger_s, 2, "a",
                                   settings.ack_interval_s, timeout_s=limit()))

        watcher = HeartbeatWatcher(lambda: read_heartbeat(heartbeat), settings.detect_timeout_s, fail_over).start()
        def mark() -> dict[str, dict[str, float]]:
            at_batch = a.call("measure_at_batch", TASK_ID, limit(), timeout_s=limit() + 30)
            return {"a": at_batch, "b": b.call("measure", TASK_ID, timeout_s=limit())}

        marks = [mark()]
        for i in range(settings.slices):
            running = i % 2 == 1
            progress(f"{mode}: measuring, HA duties {'on' if running else 'off'} ({i + 1}/{settings.slices})")
            a.call("set_duties", TASK_ID, running, timeout_s=limit())
            time.sleep(settings.measure_s / settings.slices)
            marks.append(mark())
        status_a = a.call("ha_status", TASK_ID, timeout_s=limit())
        status_b_before = b.call("ha_status", TASK_ID, timeout_s=limit())
        progress(f"{mode}: the host crashes (kill -9 of every process in it)")
        kill_at = time.time()
        a.kill()
        if watcher.wait(settings.detect_timeout_s + limit()) is None:
            raise HABenchError(f"{mode}: the failure was not detected")
        if watcher.detected_at < kill_at:
            raise HABenchError(f"{mode}: the host was taken for failed {kill_at - watcher.detected_at:.2f} s before the kill "
                               f"(its heartbeat stalled past {settings.detect_timeout_s} s); rerun on a quieter machine or with a longer timeout")
        if watcher.error is not None:
            raise HABenchError(f"{mode}: the takeover failed: {watcher.error}")
        progress(f"{mode}: running on the new host")
        time.sleep(settings.after_s)
        fed = feed.close()
        progress(f"{mode}: draining")
        status_b = b.call("ha_status", TASK_ID, timeout_s=limit())
        drain_began = time.monotonic()
        b.call("drain", TASK_ID, limit(), timeout_s=limit() + 30)
        drain_s = time.monotonic() - drain_began
        out = broker_outputs(broker, [TASK_ID])
        batches = read_results(broker, TASK_ID)
    finally:
        if watcher is not None:
            watcher.stop()
        if feed is not None:
            feed.stop()
        for side in (a, b):
            if side is not None:
                side.close()
        if broker is not None:
            broker.close()
        if server is not None:
            server.stop()
        if hosts is not None:
            hosts.close()

    expected = compute(itertools.islice(traffic(profile, settings.seed), fed), settings.params)
    delays, first_after = _emissions(batches, feed.reached, kill_at)
    before, after = marks[0], marks[-1]
    cpu = {name: after[name]["cpu_s"] - before[name]["cpu_s"] for name in after}
    rows = after["a"]["rows"] - before["a"]["rows"]
    per_row = sliced_cpu_per_row(marks)
    paired = round(per_row["on"] / per_row["off"], 3) if per_row["on"] and per_row["off"] else None
    ha_cpu = status_a["duty_cpu_s"] + status_b_before["apply_cpu_s"]
    detection = takeover["detected_at"] - kill_at
    recovery = None if first_after is None else first_after - kill_at
    result = {
        "mode": mode,
        "overhead_ratio": None if mode == "active_standby" else paired,
        "overhead_method": "against mode none's run" if mode == "active_standby" else "paired",
        "overhead_ratio_paired": paired,
        "overhead_ratio_unpaired": None,
        "detection_s": round(detection, 3),
        "recovery_s": None if recovery is None else round(recovery, 3),
        "recovery_after_detection_s": None if recovery is None else round(recovery - detection, 3),
        "lost_results": len(out.lost(expected)),
        "duplicate_results": len(out.duplicates),
        "unexpected_results": len(out.extra(expected)),
        "expected_results": len(expected),
        "cpu_s_per_1000_rows": per_row["on"],
        "cpu_s_per_1000_rows_duties_off": per_row["off"],
        "ha_cpu_s_per_1000_rows": round(1000 * ha_cpu / status_a["rows"], 4) if status_a["rows"] else None,
        "slices": slice_figures(marks),
        "cpu_s": {name: round(v, 3) for name, v in cpu.items()},
        "rows_measured": int(rows),
        "measured_s": round(after["a"]["time"] - before["a"]["time"], 3),
        "takeover_s": round(takeover["takeover_s"], 3),
        "takeover_returned_s": round(takeover["returned_at"] - kill_at, 3),
        "replayed_messages": takeover["replayed_messages"],
        "promoted_rows": takeover["promoted_rows"],
        "host": status_a,
        "new_host": status_b,
        "connections_fed": fed,
        "stream_messages": feed.feeder.files,
        "drain_s": round(drain_s, 3),
        "elapsed_s": round(time.monotonic() - began, 3),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "delays": delays,
    }
    return result


def run_ha_bench(settings: HASettings, work_dir: str | Path, progress: Callable[[str, int], None] = lambda what, done: None) -> dict[str, Any]:
    """Every mode of `settings.modes` in turn; one JSON-ready object with `modes` and the settings."""
    load_before = load_average()
    began = time.monotonic()
    modes = []
    for i, mode in enumerate(settings.modes):
        remaining = settings.timeout_s - (time.monotonic() - began)
        if remaining <= 0:
            raise HABenchError(f"the run passed its time limit of {settings.timeout_s:.0f} s")
        one = HASettings(**{**asdict(settings), "params": settings.params, "timeout_s": remaining})
        modes.append(run_mode(mode, one, work_dir, lambda what, i=i: progress(what, i)))
        progress(f"{mode}: done", i + 1)
    ratios = overhead_ratios({m["mode"]: m["cpu_s_per_1000_rows"] for m in modes})
    for m in modes:
        m["overhead_ratio_unpaired"] = ratios[m["mode"]]
        if m["mode"] == "active_standby":
            m["overhead_ratio"] = ratios[m["mode"]]
        m["goals"] = goals(m)
    return {
        "benchmark": "ha",
        "modes": modes,
        "settings": {**asdict(settings), "params": asdict(settings.params)},
        "elapsed_s": round(time.monotonic() - began, 3),
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


def without_delays(result: dict[str, Any]) -> dict[str, Any]:
    """The result with each mode's per-window delays left out (for tables and docs)."""
    return {**result, "modes": [{k: v for k, v in m.items() if k != "delays"} for m in result["modes"]]}


def plot_delays(result: dict[str, Any], path: str | Path) -> Path:
    """A PNG with, per mode, the delay of every window written against the time relative to the kill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = result["modes"]
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 2.1 * len(modes) + 0.6), sharex=True, squeeze=False)
    colours = {1: "tab:blue", 2: "tab:orange", None: "tab:gray"}
    for ax, mode in zip(axes[:, 0], modes):
        for epoch in sorted({p["epoch"] for p in mode["delays"]}, key=lambda e: -1 if e is None else e):
            pts = [p for p in mode["delays"] if p["epoch"] == epoch and p["delay_s"] is not None]
            label = {1: "host (epoch 1)", 2: "after failover (epoch 2)"}.get(epoch, f"epoch {epoch}")
            ax.plot([p["t"] for p in pts], [p["delay_s"] for p in pts], "o", ms=3, color=colours.get(epoch, "tab:green"), label=label)
        ax.axvline(0, color="red", lw=1)
        ax.axvline(mode["detection_s"], color="red", lw=1, ls="--")
        if mode["recovery_s"] is not None:
            ax.axvline(mode["recovery_s"], color="black", lw=1, ls=":")
        recovery = "no output after the kill" if mode["recovery_s"] is None else f"recovery {mode['recovery_s']:.2f} s"
        lost = f", {mode['lost_results']} results lost" if mode["lost_results"] else ""
        ax.set_title(f"{mode['mode']}: detection {mode['detection_s']:.2f} s, {recovery}{lost}, "
                     f"overhead x{mode['overhead_ratio'] if mode['overhead_ratio'] is not None else '?'}", fontsize=9)
        ax.set_ylabel("delay, s")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper left", fontsize="small")
    axes[-1, 0].set_xlabel("time of the result relative to the kill -9 of the host, s "
                           "(red: kill and detection; dotted: first result after the kill)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    """Entry point of a worker process (`python -m bpm_app.bench.ha --worker NAME ROOT MASTER CONF_JSON`)."""
    from bpm_app.bench.move import main as worker_main

    worker_main(argv, side_class=HASide, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    # Through the package module, so objects sent back pickle as `bpm_app.bench.ha.*`, not `__main__.*`.
    from bpm_app.bench.ha import main as worker_main

    worker_main()
