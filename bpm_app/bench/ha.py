"""High availability of a task under each mode, with a crash of its host mid-stream, or a partition.

For each mode in turn (one after another, so two Spark processes at a time fit two cores):
the command starts two worker processes, each with its own SparkSession (`local[1]`) and
`SparkHost`: the host `a` and the second participant `b` (`python -m bpm_app.bench.ha --worker`,
orders over an authenticated socket as in `bpm_app.bench.move`), each in a host of its own
(a network namespace, `spark_agents.hosts`) where the machine allows it, else on loopback.
A paced feeder in the command publishes the query's generated records (`bpm_app.bench.workload`)
into the task's origin's
stream on a NATS server the command runs on the machine (the origin `o`, which neither
worker is: it outlives the crash; both hosts reach it on the machine's address on their
bridge), and both workers read it and acknowledge it over the network
(`spark_agents.broker.inputs`; as the stream's owner user: who may read what is the agents'
business, tested on its own). `a` runs the task at epoch 1 through the output fence on the
origin's broker and does its mode's duties (`spark_agents.ha.roles`);
`b` is a warm participant that, per mode, does nothing (none, upstream backup), applies the
deltas `a` sends it over the network (passive standby), or runs the replica with its
output held back (active standby). `a` beats over the network (signed UDP datagrams to the
command, `spark_agents.ha.heartbeat`); the command watches the beats.

After a warm-up, the CPU time of both processes (Python and Spark's JVM with its Python
workers, from /proc) and the rows `a` processed are measured over an interval; then the
fault (`HASettings.fault`):

* `crash`: `a`'s host crashes: every process in it is killed with SIGKILL at once. The
  watcher sees the heartbeat silent past the timeout and at once tells `b` to take the
  task over at epoch 2.
* `cut`: `a`'s host is cut off from every other host and from the machine (the origin's
  broker and the watcher included) for `cut_s`; its processes run on, unheard. The watcher
  cannot tell a cut from a crash and fails the task over to `b` the same way. Then the
  link heals: `a`'s query, at its next batch, finds its output claimed at epoch 2 and its
  write refused by the fence (the query fails); the command then tells `a` that it lost
  the task (as the registry's answer tells an agent), and `a` stops it and its duties.
* `link`: only the link between `a` and `b` is cut for `cut_s`, then healed: both still
  reach the origin and the watcher, so nothing fails over; passive standby's deltas fail
  while it lasts and resume after.

The feed goes on for a while, then closes (end mark); the task's host (`b` after a
failover, else `a`) drains the stream; the results on the origin's broker are compared
with the plain computation over exactly what was fed.

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
* `detection_s`: from the fault to the detection (None with `link`: nothing is detected),
  and `last_beat_s`, when the last beat before it arrived, relative to the fault (a beat sent
  just before the fault and read late by a busy watcher comes after it);
* `recovery_s`: from the fault to the first output written after it (when the origin's
  broker stored the batch), and `recovery_after_detection_s`, the part after the detection;
* `partition` (with `cut` and `link`): how long the cut lasted; with `cut`, when after the
  heal `a`'s query was refused by the fence (`refused_after_heal_s`, its error) and how many
  batches at `a`'s old epoch reached the output after `b`'s first (`old_epoch_batches_after_takeover`,
  which the fence keeps at 0); with `link`, whether the task failed over (it must not),
  the duty rounds of `a` that failed (deltas sent into the cut) and when after the heal the
  backup applied a delta again;
* `lost_results`, `duplicate_results`, `unexpected_results` against the plain computation;
* `delays`: per result time written (a window's end), when (relative to the fault) and its
  delay, the time it was written minus the time the stream reached that time (the first
  flush of the feeder that admitted an event at or past it); the plot shows them per mode.
"""

from __future__ import annotations

import itertools
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_agents.hosts import Hosts
from spark_agents.metrics import SparkCpu
from bpm_app.bench.move import PacedFeed, RemoteSide, Side, load_average, own_address, step_limits
from bpm.ha.decisions import HA_MODES, PRECISE_MODES
from bpm.query import Params, Query
from bpm_app.bench.workload import MONITORING, Workload
from examples.network_monitoring import SHORT_RUN

if TYPE_CHECKING:
    from spark_agents.broker.source import JetStreamInput

ORIGIN = "o"
TASK_ID = f"{ORIGIN}.ha-0"
DETECTION_GOAL_S = 3.0
RECOVERY_GOALS_S = {"active_standby": 1.0, "passive_standby": 5.0}
OVERHEAD_GOALS = {"upstream_backup": 1.05, "passive_standby": 1.15}
# The network-monitoring query's short-run parameters: 10 s windows, a result about every second of wall time.
BENCH_WORKLOAD = Workload(MONITORING, tuple(SHORT_RUN.items()))
FAULTS = ("crash", "cut", "link")
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
        rate: records per second of event time in the generated input.
        speedup: event time per second of wall time.
        seed: seed of the generated input.
        copy_interval_s: how often passive standby ships a delta checkpoint.
        ack_interval_s: how often the other modes acknowledge the stream.
        heartbeat_s: how often the host beats.
        detect_timeout_s: silence after which the host counts as failed.
        warmup_s: run time before measuring.
        measure_s: the measuring interval before the fault.
        slices: how many slices the interval is cut into, alternating HA duties off and on (even).
        after_s: feeding time after the fault (after the heal, with a partition), before the stream closes.
        timeout_s: limit of the whole run; step_timeout_s: of any single step.
        lean: run each local driver with `spark_agents.session.LEAN_JVM_OPTIONS`, as agents on a local master do.
        extra_conf: further Spark settings of both sessions.
        workload: the task's query and parameters (`bpm_app.bench.workload.Workload`; by default
            the network-monitoring query with 10 s windows: a result about every second of wall time).
        hosts: run `a` and `b` each in a host of its own (a network namespace, `spark_agents.hosts`)
            where the machine allows it: the failure is then a crash of `a`'s host.
        fault: `crash` (a kill -9 of `a`'s host), `cut` (`a`'s host cut off from all, then healed)
            or `link` (the link between `a` and `b` cut, then healed); a partition needs hosts.
        cut_s: how long a partition lasts.
        tls: the origin's broker serves TLS with a certificate of its own, which both sides
            pin, as an agent's broker does (`spark_agents.tls`); False: plain text.
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
    workload: Workload = BENCH_WORKLOAD
    hosts: bool = True
    fault: str = "crash"
    cut_s: float = 10.0
    tls: bool = True

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}; got {self.fault!r}")
        if self.fault != "crash" and not self.hosts:
            raise ValueError("a partition needs hosts (network namespaces): leave --hosts on")
        unknown = [m for m in self.modes if m not in HA_MODES]
        if unknown or not self.modes:
            raise ValueError(f"modes must be among {', '.join(HA_MODES)}; got {', '.join(self.modes) or 'none'}")
        if min(self.trigger_s, self.flush_s, self.rate, self.speedup, self.copy_interval_s, self.ack_interval_s,
               self.heartbeat_s, self.detect_timeout_s, self.measure_s, self.timeout_s, self.step_timeout_s, self.cut_s) <= 0:
            raise ValueError("intervals, rates and time limits must be positive")
        if self.warmup_s < 0 or self.after_s < 0:
            raise ValueError("warm-up and after-failure times must not be negative")
        if self.slices < 2 or self.slices % 2:
            raise ValueError("the measuring interval needs an even number of slices, at least 2")
        if self.heartbeat_s >= self.detect_timeout_s:
            raise ValueError("the heartbeat interval must be shorter than the detection timeout")
        self.workload.check()

    def spark_conf(self) -> dict[str, str]:
        conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
        if self.lean and self.master.startswith("local"):
            from spark_agents.session import LEAN_JVM_OPTIONS, log_config

            # The whole option string: a conf entry replaces make_session's default (the log configuration).
            conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log_config()} {LEAN_JVM_OPTIONS}"
        return {**conf, **dict(self.extra_conf)}


# -- one participant: a warm session, a task host and the HA roles -----------------------------


def _connect(address: tuple[str, int], key: bytes, timeout_s: float) -> Connection:
    """A connection to a `Listener` at `address`, as `Client` makes it, that fails with a
    timeout when it is not made, or a write or read does not go through, within `timeout_s`."""
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.settimeout(None)  # the connection reads and writes in blocking mode, polling for answers itself
    # ... but a write (a delta larger than what a cut link lets through) or a read that waits
    # longer than `timeout_s` fails, as an answer that does not come does.
    limit = struct.pack("ll", int(timeout_s), int(timeout_s % 1 * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
    made = Connection(sock.detach())
    try:
        answer_challenge(made, key)
        deliver_challenge(made, key)
    except BaseException:
        made.close()
        raise
    return made


def _delta_shipper(inbox: tuple[str, int, str], timeout_s: float) -> Callable[[bytes], int | None]:
    """Send passive-standby deltas to the backup's socket (`inbox`: address, port and key); returns its acknowledged position.

    A delta not answered within `timeout_s` (the link to the backup is cut) fails, and so does
    a connection not made within it (a cut link drops the connection's first packet, and
    the system would retry it for minutes): the connection is dropped and the next delta
    connects anew, so a healed link carries deltas again. (The primary keeps what it could
    not ship and sends it with the next delta.)"""
    lock = threading.Lock()
    conn: list[Any] = []  # the open connection, if any

    def ship(data: bytes) -> int | None:
        with lock:
            try:
                if not conn:
                    conn.append(_connect((inbox[0], inbox[1]), bytes.fromhex(inbox[2]), timeout_s))
                conn[0].send_bytes(data)
                if not conn[0].poll(timeout_s):
                    raise TimeoutError(f"the backup did not answer a delta within {timeout_s:.0f} s")
                status, value = conn[0].recv()
            except (OSError, EOFError):
                if conn:
                    conn.pop().close()
                raise
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
        self._spark_cpu = SparkCpu(proc.pid) if proc is not None else None
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
        from spark_agents.pipeline import run_pipeline

        query, params = BENCH_WORKLOAD.load()
        run_pipeline(self.spark, query, params, itertools.islice(BENCH_WORKLOAD.records(rate=100.0, seed=99), 4000), work_dir=self.root)

    @staticmethod
    def _stream(source: JetStreamInput):
        """The task's key groups of the origin's stream, acknowledged on the origin's `Retention`."""
        from spark_agents.broker.retention import Retention
        from spark_agents.broker.inputs import OwnAcks, TaskInput

        return TaskInput(source, OwnAcks(Retention(source.connection(), source.participant), source.prefix, source.input))

    def _start_duties(self, task_id: str, mode: str, source: JetStreamInput, query: Query, params: Params,
                      interval_s: float, ship: Callable[[bytes], Any] | None = None) -> None:
        from spark_agents.ha.roles import PrimaryDuties, consumer_name

        duties = PrimaryDuties(self.host, task_id, mode, self._stream(source), consumer_name(task_id, self.name),
                               query=query, params=params, interval_s=interval_s, ship=ship)
        self._duties[task_id] = duties.start()

    def beat(self, key_hex: str, address: str, port: int, interval_s: float) -> None:
        """Start beating as this participant to the watcher at `address`:`port`, signed with the key."""
        from spark_agents.ha.heartbeat import HeartbeatSender

        self._beat = HeartbeatSender(self.name, bytes.fromhex(key_hex), (address, port), interval_s).start()

    def task_state(self, task_id: str) -> dict[str, Any]:
        """Whether the task still runs here (`running`, `failed`, `stopped`, or `gone`) and its error."""
        task = next((t for t in self.host.tasks() if t.task_id == task_id), None)
        return {"state": "gone", "error": None} if task is None else {"state": task.state, "error": task.error}

    def lose(self, task_id: str) -> None:
        """This participant lost the task (it was failed over while it was cut off): stop its duties and the task."""
        duties = self._duties.pop(task_id, None)
        if duties is not None:
            duties.stop()
        if any(t.task_id == task_id for t in self.host.tasks()):
            self.host.stop_task(task_id)
            self.host.remove_task(task_id)

    def delta_inbox(self, task_id: str) -> tuple[str, int, str]:
        """Be the passive backup of `task_id`: take deltas on a socket at this worker's address; returns its address, port and key."""
        from spark_agents.ha.roles import PassiveBackup

        backup = self._backups[task_id] = PassiveBackup(self.root / "backups" / task_id)
        key = secrets.token_bytes(32)
        self._inbox = listener = Listener((own_address(), 0), authkey=key)

        applying = threading.Lock()

        def serve_one(conn) -> None:
            with conn:
                while True:
                    try:
                        data = conn.recv_bytes()
                        with applying:
                            try:
                                answer = ("ok", backup.apply(data).ack_position)
                            except Exception as exc:  # noqa: BLE001 - the primary keeps the delta and retries
                                answer = ("error", f"{type(exc).__name__}: {exc}")
                        conn.send(answer)
                    except (EOFError, OSError):
                        return

        def serve() -> None:
            # A primary whose link was cut connects anew once it heals; the old connection ends on its own.
            while True:
                try:
                    conn = listener.accept()
                except OSError:
                    return
                threading.Thread(target=serve_one, args=(conn,), name="bpm-ha-inbox-conn", daemon=True).start()

        threading.Thread(target=serve, name="bpm-ha-inbox", daemon=True).start()
        return listener.address[0], listener.address[1], key.hex()

    def start_primary(self, mode: str, task_id: str, source: JetStreamInput, workload: Workload,
                      trigger_s: float, epoch: int, interval_s: float, inbox: tuple[str, int, str] | None) -> None:
        """Host the task at `epoch` with its mode's duties (`inbox`: the passive backup's socket)."""
        from spark_agents.ha.roles import start_primary

        query, params = workload.load()
        ship = None if inbox is None else _delta_shipper(inbox, ship_timeout_s(interval_s))
        self._sinks[task_id] = start_primary(self.host, task_id, self._stream(source), epoch, query, params,
                                             trigger_s=trigger_s, checkpoint_dir=self.checkpoint_dir(task_id))
        self._start_duties(task_id, mode, source, query, params, interval_s, ship)

    def start_replica(self, task_id: str, source: JetStreamInput, workload: Workload, trigger_s: float,
                      interval_s: float) -> None:
        """Run the active-standby replica: output held back, the stream acknowledged after its own batches."""
        from spark_agents.ha.roles import start_replica

        query, params = workload.load()
        self._sinks[task_id] = start_replica(self.host, task_id, self._stream(source), query, params,
                                             trigger_s=trigger_s, checkpoint_dir=self.checkpoint_dir(task_id))
        self._start_duties(task_id, "active_standby", source, query, params, interval_s)

    def take_over(self, mode: str, task_id: str, source: JetStreamInput, workload: Workload,
                  trigger_s: float, epoch: int, failed: str, interval_s: float) -> dict[str, Any]:
        """Take the task over from the failed participant `failed` at `epoch`."""
        from spark_agents.ha.roles import consumer_name, take_over

        began = time.perf_counter()
        query, params = workload.load()
        stream = self._stream(source)
        newest = stream.newest()
        took = take_over(self.host, task_id, mode, epoch=epoch, stream=stream,
                         consumer=consumer_name(task_id, self.name), failed_consumer=consumer_name(task_id, failed),
                         query=query, params=params, trigger_s=trigger_s, checkpoint_dir=self.checkpoint_dir(task_id),
                         backup=self._backups.get(task_id), replica=self._sinks.get(task_id))
        self._sinks[task_id] = took.sink
        if mode in ("none", "upstream_backup"):
            self._start_duties(task_id, mode, source, query, params, interval_s)
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
        return int(self.host.backlog(task, max_age_s=0.0)["pending"])

    def measure(self, task_id: str) -> dict[str, float]:
        """This process's CPU seconds so far (Python and its Spark JVM) and the input rows the task processed here."""
        rows = sum(t.rows for t in self.host.tasks() if t.task_id == task_id)
        cpu = self._spark_cpu.seconds() if self._spark_cpu is not None else None
        return {"time": time.time(), "cpu_s": time.process_time() if cpu is None else cpu, "rows": float(rows)}

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
        "partition_safe": _partition_safe(mode.get("partition")),
    }


def _partition_safe(partition: dict[str, Any] | None) -> bool | None:
    """A cut-off host's late writes all refused; a cut between host and backup failed nothing over."""
    if partition is None:
        return None
    if "failed_over" in partition:
        return not partition["failed_over"]
    return partition.get("old_epoch_batches_after_takeover") == 0 and partition["old_host_state"] != "running"


def _emissions(batches: list, reached: list[tuple[float, int]], fault_at: float) -> tuple[list[dict[str, Any]], float | None]:
    """Per result time written (`batches`: the task's result batches on the origin's broker; a
    window's end): when (relative to the fault), by which epoch, its delay after the feeder's
    flush that reached it (`reached`: `PacedFeed.reached`); and the first write after the fault."""
    import bisect

    times, newest = [t for t, _ in reached], [us for _, us in reached]

    def stream_reached(time_us: int) -> float | None:
        i = bisect.bisect_left(newest, time_us)  # the newest event time never moves back
        return times[i] if i < len(times) else None

    points = []
    first_after = None
    for batch in batches:
        if batch.at > fault_at and (first_after is None or batch.at < first_after):
            first_after = batch.at
        for time_us in sorted({r.time_us for r in batch.rows}):
            at = stream_reached(time_us)
            points.append({"t": round(batch.at - fault_at, 3), "delay_s": None if at is None else round(batch.at - at, 3),
                           "result_time_s": time_us / 1_000_000, "epoch": batch.epoch})
    points.sort(key=lambda p: p["t"])
    return points, first_after


def old_epoch_batches_after_takeover(batches: list) -> int:
    """Batches at an older epoch stored after the first batch of the newest epoch: what a host
    that lost its task still wrote (the fence keeps it at 0)."""
    if not batches:
        return 0
    newest = max(b.epoch for b in batches)
    first = min(b.seq for b in batches if b.epoch == newest)
    return sum(1 for b in batches if b.epoch < newest and b.seq > first)


# -- the run -------------------------------------------------------------------------------------


def _heal_cut(mode: str, settings: HASettings, hosts: Hosts, a: RemoteSide, fault_at: float,
              limit: Callable[[], float], progress: Callable[[str], None]) -> dict[str, Any]:
    """Heal `a`'s host once it has been cut off `cut_s`; wait until its query has been refused
    by the fence (or ended otherwise), then tell it that it lost the task."""
    time.sleep(max(0.0, fault_at + settings.cut_s - time.time()))
    hosts.heal("a")
    healed_at = time.time()
    progress(f"{mode}: the link heals; the old host finds its task taken")
    deadline = time.monotonic() + limit()
    while (state := a.call("task_state", TASK_ID, timeout_s=limit()))["state"] == "running":
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    refused = time.time()
    a.call("lose", TASK_ID, timeout_s=limit())
    error = state["error"] or ""
    return {
        "cut_s": round(healed_at - fault_at, 3),
        "refused_after_heal_s": None if state["state"] == "running" else round(refused - healed_at, 3),
        "old_host_state": state["state"],
        "refused_by_fence": "FencedError" in error,
        "old_host_error": _error_line(error),
        "stopped_after_heal_s": round(time.time() - healed_at, 3),
    }


def _error_line(error: str) -> str | None:
    """The line of a failed query's error that names the Python exception (Spark wraps it in its own text and plan)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    chosen = [line for line in lines if "Error:" in line or "Exception:" in line] or lines
    return chosen[-1][:300] if chosen else None


def ship_timeout_s(copy_interval_s: float) -> float:
    """How long a passive-standby primary waits for the backup to answer a delta (`_delta_shipper`)."""
    return 2 * copy_interval_s


def _cut_link(mode: str, settings: HASettings, hosts: Hosts, a: RemoteSide, b: RemoteSide, watcher: Any,
              limit: Callable[[], float], progress: Callable[[str], None]) -> dict[str, Any]:
    """Cut the link between `a` and `b` for `cut_s` and heal it: both still reach the origin and
    the watcher, so nothing may fail over; passive standby's deltas fail meanwhile and resume after."""
    progress(f"{mode}: the link between the host and the backup is cut for {settings.cut_s:g} s")
    before = a.call("ha_status", TASK_ID, timeout_s=limit())
    cut_at = time.time()
    hosts.cut_link("a", "b")
    time.sleep(settings.cut_s)
    hosts.heal_link("a", "b")
    healed_at = time.time()
    committed_at_heal = b.call("ha_status", TASK_ID, timeout_s=limit())["backup_committed"]
    progress(f"{mode}: the link heals")
    resumed = None
    if mode == "passive_standby":
        # A delta sent into the cut fails at the shipper's timeout (perhaps after the heal); the next one connects anew.
        deadline = time.monotonic() + ship_timeout_s(settings.copy_interval_s) + 10 * settings.copy_interval_s
        while time.monotonic() < deadline:
            committed = b.call("ha_status", TASK_ID, timeout_s=limit())["backup_committed"]
            if committed is not None and committed != committed_at_heal:
                resumed = round(time.time() - healed_at, 3)
                break
            time.sleep(0.2)
    after = a.call("ha_status", TASK_ID, timeout_s=limit())
    return {
        "cut_s": round(healed_at - cut_at, 3),
        "failed_over": watcher.detected_at is not None,
        "duty_failures": after["duty_failures"] - before["duty_failures"],
        "deltas_resumed_after_heal_s": resumed,
    }


def run_mode(mode: str, settings: HASettings, work_dir: str | Path, progress: Callable[[str], None] = lambda what: None) -> dict[str, Any]:
    """One mode: start the origin's broker and both participants, feed, measure, crash or cut
    the host (or the link between the two), fail over, heal, drain, check the results."""
    from spark_agents.broker.results import broker_outputs, read_results
    from spark_agents.broker.server import NatsServer, User
    from spark_agents.broker.source import JetStreamInput
    from spark_agents.broker.stream import Broker, BrokerStream
    from spark_agents.tls import own_certificate
    from spark_agents.ha.heartbeat import HeartbeatReceiver, HeartbeatWatcher

    root = Path(work_dir) / mode
    began = time.monotonic()
    load_before = load_average()
    limit = step_limits(settings.timeout_s, settings.step_timeout_s, lambda message: HABenchError(f"{mode}: {message}"))

    workload = settings.workload
    owner = User(ORIGIN, secrets.token_urlsafe(16))
    a = b = feed = watcher = receiver = server = broker = None
    takeover: dict[str, Any] = {}
    partition: dict[str, Any] | None = None
    # `a` and `b` are hosts of their own where the machine allows it; the origin's broker is
    # on the machine, which every host reaches (the machine's address on the hosts' bridge).
    hosts = Hosts.open("bench-ha", root / "hosts", cpus=False, say=progress) if settings.hosts else None
    try:
        if settings.fault != "crash" and (hosts is None or hosts.net is None):
            raise HABenchError(f"a partition ({settings.fault}) needs hosts with networks of their own (root on Linux, with iproute2)")
        progress(f"{mode}: starting the origin's broker and two Spark processes")
        broker_address = hosts.net.gateway if hosts is not None and hosts.net is not None else "127.0.0.1"
        served = own_certificate(root / ORIGIN, ORIGIN, [broker_address]) if settings.tls else None
        server = NatsServer.on_free_ports(ORIGIN, root / ORIGIN / "broker", [owner], host=broker_address, tls=served).start()
        pem = None if served is None else served.pem
        broker = Broker(server.url, owner.name, owner.password, tls=pem)
        broker.ensure_stream(ORIGIN)  # before any reader: a query's first plan asks for the stream
        source = JetStreamInput(server.url, owner.name, owner.password, ORIGIN, tls=pem)
        b = RemoteSide("b", root, settings.master, settings.spark_conf(), limit(), module="bpm_app.bench.ha", hosts=hosts)
        a = RemoteSide("a", root, settings.master, settings.spark_conf(), limit(), module="bpm_app.bench.ha", hosts=hosts)
        b.wait_ready(limit())
        a.wait_ready(limit())
        inbox = b.call("delta_inbox", TASK_ID, timeout_s=limit()) if mode == "passive_standby" else None
        if mode == "active_standby":
            b.call("start_replica", TASK_ID, source, workload, settings.trigger_s, settings.ack_interval_s, timeout_s=limit())
        interval = settings.copy_interval_s if mode == "passive_standby" else settings.ack_interval_s
        a.call("start_primary", mode, TASK_ID, source, workload, settings.trigger_s, 1, interval, inbox, timeout_s=limit())
        beat_key = secrets.token_bytes(32)
        receiver = HeartbeatReceiver(beat_key, broker_address).start()
        a.call("beat", beat_key.hex(), *receiver.address, settings.heartbeat_s, timeout_s=limit())
        feed = PacedFeed(BrokerStream(broker, ORIGIN), settings)  # reads flush_s, speedup, rate, seed and the workload from the settings
        feed.start()
        a.call("wait_new_batch", TASK_ID, -1, limit(), timeout_s=limit() + 30)
        progress(f"{mode}: warming up")
        time.sleep(settings.warmup_s)
        # Measure a task that keeps up with its input, not one still catching up on a backlog.
        while a.call("backlog_messages", TASK_ID, timeout_s=limit()) > CAUGHT_UP_MESSAGES:
            time.sleep(0.5)

        def fail_over(detected_at: float, last_beat: float | None) -> None:
            takeover["detected_at"], takeover["last_beat"] = detected_at, last_beat
            takeover.update(b.call("take_over", mode, TASK_ID, source, workload, settings.trigger_s, 2, "a",
                                   settings.ack_interval_s, timeout_s=limit()))

        watcher = HeartbeatWatcher(lambda: receiver.last_beat("a"), settings.detect_timeout_s, fail_over).start()
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
        fault_at = time.time()
        if settings.fault == "link":
            partition = _cut_link(mode, settings, hosts, a, b, watcher, limit, progress)
            task_host = a
        else:
            if settings.fault == "cut":
                progress(f"{mode}: the host is cut off from every other host for {settings.cut_s:g} s")
                hosts.cut("a")
            else:
                progress(f"{mode}: the host crashes (kill -9 of every process in it)")
                a.kill()
            if watcher.wait(settings.detect_timeout_s + limit()) is None:
                raise HABenchError(f"{mode}: the failure was not detected")
            if watcher.detected_at < fault_at:
                raise HABenchError(f"{mode}: the host was taken for failed {fault_at - watcher.detected_at:.2f} s before the fault "
                                   f"(its heartbeat stalled past {settings.detect_timeout_s} s); rerun on a quieter machine or with a longer timeout")
            if watcher.error is not None:
                raise HABenchError(f"{mode}: the takeover failed: {watcher.error}")
            progress(f"{mode}: running on the new host")
            if settings.fault == "cut":
                partition = _heal_cut(mode, settings, hosts, a, fault_at, limit, progress)
            task_host = b
        time.sleep(settings.after_s)
        fed = feed.close()
        progress(f"{mode}: draining")
        status_b = b.call("ha_status", TASK_ID, timeout_s=limit())
        drain_began = time.monotonic()
        task_host.call("drain", TASK_ID, limit(), timeout_s=limit() + 30)
        drain_s = time.monotonic() - drain_began
        out = broker_outputs(broker, [TASK_ID])
        batches = read_results(broker, TASK_ID)
    finally:
        if watcher is not None:
            watcher.stop()
        if receiver is not None:
            receiver.close()
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

    expected = workload.expected(settings.rate, settings.seed, fed, root / "reference")
    delays, first_after = _emissions(batches, feed.reached, fault_at)
    before, after = marks[0], marks[-1]
    cpu = {name: after[name]["cpu_s"] - before[name]["cpu_s"] for name in after}
    rows = after["a"]["rows"] - before["a"]["rows"]
    per_row = sliced_cpu_per_row(marks)
    paired = round(per_row["on"] / per_row["off"], 3) if per_row["on"] and per_row["off"] else None
    ha_cpu = status_a["duty_cpu_s"] + status_b_before["apply_cpu_s"]
    if partition is not None and settings.fault == "cut":
        partition["old_epoch_batches_after_takeover"] = old_epoch_batches_after_takeover(batches)
    detection = takeover["detected_at"] - fault_at if takeover else None
    last_beat = takeover["last_beat"] - fault_at if takeover and takeover["last_beat"] is not None else None
    recovery = None if first_after is None or detection is None else first_after - fault_at
    result = {
        "mode": mode,
        "fault": settings.fault,
        "overhead_ratio": None if mode == "active_standby" else paired,
        "overhead_method": "against mode none's run" if mode == "active_standby" else "paired",
        "overhead_ratio_paired": paired,
        "overhead_ratio_unpaired": None,
        "detection_s": None if detection is None else round(detection, 3),
        "last_beat_s": None if last_beat is None else round(last_beat, 3),
        "recovery_s": None if recovery is None else round(recovery, 3),
        "recovery_after_detection_s": None if recovery is None else round(recovery - detection, 3),
        "partition": partition,
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
        "takeover_s": round(takeover["takeover_s"], 3) if takeover else None,
        "takeover_returned_s": round(takeover["returned_at"] - fault_at, 3) if takeover else None,
        "replayed_messages": takeover.get("replayed_messages"),
        "promoted_rows": takeover.get("promoted_rows"),
        "host": status_a,
        "new_host": status_b,
        "records_fed": fed,
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
        one = replace(settings, timeout_s=remaining)
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
        "settings": asdict(settings),
        "elapsed_s": round(time.monotonic() - began, 3),
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


def without_delays(result: dict[str, Any]) -> dict[str, Any]:
    """The result with each mode's per-window delays left out (for tables and docs)."""
    return {**result, "modes": [{k: v for k, v in m.items() if k != "delays"} for m in result["modes"]]}


FAULT_WORDS = {"crash": "the kill -9 of the host", "cut": "the cut of the host from all", "link": "the cut of the host-backup link"}


def plot_delays(result: dict[str, Any], path: str | Path) -> Path:
    """A PNG with, per mode, the delay of every window written against the time relative to the fault."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = result["modes"]
    fault = result["settings"].get("fault", "crash")
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 2.1 * len(modes) + 0.6), sharex=True, squeeze=False)
    colours = {1: "tab:blue", 2: "tab:orange", None: "tab:gray"}
    for ax, mode in zip(axes[:, 0], modes):
        for epoch in sorted({p["epoch"] for p in mode["delays"]}, key=lambda e: -1 if e is None else e):
            pts = [p for p in mode["delays"] if p["epoch"] == epoch and p["delay_s"] is not None]
            label = {1: "host (epoch 1)", 2: "after failover (epoch 2)"}.get(epoch, f"epoch {epoch}")
            ax.plot([p["t"] for p in pts], [p["delay_s"] for p in pts], "o", ms=3, color=colours.get(epoch, "tab:green"), label=label)
        ax.axvline(0, color="red", lw=1)
        title = [mode["mode"]]
        if mode["detection_s"] is not None:
            ax.axvline(mode["detection_s"], color="red", lw=1, ls="--")
            title.append(f"detection {mode['detection_s']:.2f} s")
        partition = mode.get("partition") or {}
        if partition.get("cut_s") is not None:
            ax.axvspan(0, partition["cut_s"], color="red", alpha=0.08)
        if mode["recovery_s"] is not None:
            ax.axvline(mode["recovery_s"], color="black", lw=1, ls=":")
            title.append(f"recovery {mode['recovery_s']:.2f} s")
        elif mode["detection_s"] is not None:
            title.append("no output after the fault")
        if mode["lost_results"]:
            title.append(f"{mode['lost_results']} results lost")
        title.append(f"overhead x{mode['overhead_ratio'] if mode['overhead_ratio'] is not None else '?'}")
        ax.set_title(", ".join(title), fontsize=9)
        ax.set_ylabel("delay, s")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper left", fontsize="small")
    axes[-1, 0].set_xlabel(f"time of the result relative to {FAULT_WORDS[fault]}, s\n"
                           "(red: fault and detection; shaded: the cut, until the heal; dotted: first result after the fault)")
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
