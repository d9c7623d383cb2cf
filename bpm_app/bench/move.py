"""The pause of a task movement between two processes, beside the restart floor in one process.

Two processes each keep a warm SparkSession and a `SparkHost`: the caller (one side) and a
child started as `python -m bpm_app.bench.move --worker` (the other side), which takes orders
over a loopback socket (`multiprocessing.connection`, authenticated with a random key). A
paced feeder keeps publishing the query's generated records (`bpm_app.bench.workload`; the
network-monitoring query's Zeek-like traffic unless `--query` says otherwise) to the origin's
stream on its own NATS server (`spark_agents.broker`), so the task always has a next batch. The sides share no
folder: each has its own checkpoints, reads the stream over the network as its own broker
user (the partner may read only the task's key groups and write only its results), and
writes results through the fence on the origin's broker. The task first runs `age_batches` batches, so that the checkpoint it
hands over is as large as a long-running task's. Then rounds alternate, on the same task:

* floor: the host that runs the task stops it after a batch and starts it again from its own
  checkpoint, in the same process and session;
* movement: that host stops it after a batch and packs its checkpoint; the bytes cross to the
  other process, which unpacks them into its own checkpoint folder and starts the task there,
  at the next epoch.

Both are measured the same way: from the end of the last batch the task ran before the stop
to the end of the first batch after the start that read new input. Batch ends, not starts,
because a batch's end is when its results exist: the pause is the gap in the task's output,
and it includes what the new host pays to resume (query planning, loading the restored state
in the first batch), which a start-to-start measure would leave out. The stop is issued as
soon as a batch with input has finished, so neither figure includes time the task would
have idled anyway. Alternating floor and movement rounds lets machine noise hit both alike.

At the end the feeder closes the stream, the task drains where it last landed, and the
results on the origin's broker (one message per batch that wrote rows) are compared with
the plain computation of the same query over exactly what was fed: results lost, duplicated,
or not expected at all.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bpm_app.bench.workload import Workload

if TYPE_CHECKING:
    from spark_agents.broker.source import JetStreamInput
    from spark_agents.hosts import Hosts

TASK_ID = "a.move-0"  # origin a
PAUSE_GOAL_S = 3.0
RATIO_GOAL = 1.2
_KEY_ENV = "BPM_MOVE_BENCH_KEY"
# Where a worker listens for the benchmark's orders (and, in the HA benchmark, its backup for
# deltas): its host's address when it runs in a host of its own, else loopback.
ADDRESS_ENV = "BPM_BENCH_ADDRESS"


def own_address() -> str:
    return os.environ.get(ADDRESS_ENV, "127.0.0.1")


class MoveBenchError(RuntimeError):
    """The benchmark could not run to the end (a side failed, or a step passed its time limit)."""


@dataclass(frozen=True)
class MoveSettings:
    """What one run of the benchmark does.

    Attributes:
        moves: measured movements (and as many measured floor restarts).
        warmup: unmeasured rounds first, so both sessions have run the task before measuring.
        age_batches: batches the task runs before the first round. Its checkpoint grows with
            every batch until Spark's retention (`spark.sql.streaming.minBatchesToRetain`, 100)
            starts deleting old logs and state versions, so a task past that age has the
            checkpoint a long-running task hands over; a younger one moves faster.
        master: Spark master of both sessions.
        retain_batches: `spark.sql.streaming.minBatchesToRetain` of both sessions (None: Spark's
            default, 100): how many batches of logs and state versions a checkpoint keeps,
            hence how much a movement hands over.
        extra_conf: further Spark settings of both sessions, as (key, value) pairs.
        trigger_s: the task's processing-time trigger.
        flush_s: how often the feeder writes a stream file.
        rate: records per second of event time in the generated input.
        speedup: event time per second of wall time (windows close `speedup` times faster).
        seed: seed of the generated input.
        timeout_s: limit of the whole run.
        step_timeout_s: limit of any single step (a stop, a start, a wait for a batch).
        workload: the task's query and parameters (`bpm_app.bench.workload.Workload`).
        tls: the origin's broker serves TLS with a certificate of its own, which both sides
            pin, as an agent's broker does (`spark_agents.tls`); False: plain text.
    """

    moves: int = 10
    warmup: int = 2
    age_batches: int = 100
    master: str = "local[2]"
    retain_batches: int | None = None
    extra_conf: tuple[tuple[str, str], ...] = ()
    trigger_s: float = 1.0
    flush_s: float = 0.25
    rate: float = 100.0
    speedup: float = 10.0
    seed: int = 0
    timeout_s: float = 900.0
    step_timeout_s: float = 120.0
    workload: Workload = field(default_factory=Workload)
    tls: bool = True

    def __post_init__(self) -> None:
        if self.moves < 1:
            raise ValueError("moves must be at least 1")
        if self.warmup < 0 or self.age_batches < 0:
            raise ValueError("warmup and age_batches must not be negative")
        if self.retain_batches is not None and self.retain_batches < 1:
            raise ValueError("retain_batches must be at least 1")
        if min(self.trigger_s, self.flush_s, self.rate, self.speedup, self.timeout_s, self.step_timeout_s) <= 0:
            raise ValueError("trigger, flush interval, rate, speedup and time limits must be positive")
        self.workload.check()

    def spark_conf(self) -> dict[str, str]:
        """The configuration both sessions get on top of the project's defaults."""
        conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
        if self.retain_batches is not None:
            conf["spark.sql.streaming.minBatchesToRetain"] = str(self.retain_batches)
        return {**conf, **dict(self.extra_conf)}


# -- pure parts --------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """One finished micro-batch as the benchmark needs it (picklable across the socket)."""

    batch_id: int
    start_s: float
    end_s: float
    rows: int


@dataclass(frozen=True)
class Round:
    """One measured stop-and-start: a floor restart or a movement.

    Attributes:
        kind: "floor" or "move".
        origin, partner: the sides it went from and to (the same side for a floor).
        last: the task's last batch before the stop.
        first: its first batch with new input after the start.
        phases: seconds per step (see `measured_round`) and, for a movement, `checkpoint_bytes`.
    """

    kind: str
    origin: str
    partner: str
    last: Batch
    first: Batch
    phases: dict[str, float]

    @property
    def pause_s(self) -> float:
        return self.first.end_s - self.last.end_s


_STEPS = ("stop_s", "pack_s", "unpack_s", "start_s", "idle_s", "first_batch_s")


def measured_round(kind: str, origin: str, partner: str, last: Batch, first: Batch, steps: dict[str, float]) -> Round:
    """A round with its pause split into steps.

    `steps` holds what the sides timed (stop, pack, unpack, start, and `started_at`, when the
    start returned); added here: `idle_s`, from then to the first new batch's start (the
    trigger's wait for a file), `first_batch_s`, that batch's duration, and `other_s`, what is
    left of the pause (the checkpoint's trip between processes and the calls' own overhead).
    """
    phases = dict(steps)
    phases["idle_s"] = first.start_s - phases.pop("started_at")
    phases["first_batch_s"] = first.end_s - first.start_s
    measured = Round(kind, origin, partner, last, first, phases)
    phases["other_s"] = measured.pause_s - sum(phases.get(k, 0.0) for k in _STEPS)
    return measured


def first_new_batch(batches: list[Batch], after_batch_id: int) -> Batch | None:
    """The earliest batch after `after_batch_id` that read input, if one has finished."""
    fresh = [b for b in batches if b.batch_id > after_batch_id and b.rows > 0]
    return min(fresh, key=lambda b: b.batch_id) if fresh else None


def _stats(values: list[float]) -> tuple[float | None, float | None]:
    return (round(statistics.median(values), 3), round(max(values), 3)) if values else (None, None)


def _phase_medians(rounds: list[Round]) -> dict[str, float]:
    keys = sorted({k for r in rounds for k in r.phases} - {"pack_retries"})
    return {k: round(statistics.median(r.phases[k] for r in rounds if k in r.phases), 4) for k in keys}


def summarize(rounds: list[Round], lost: int, duplicates: int, extra: int, expected: int) -> dict[str, Any]:
    """The benchmark's figures from its measured rounds and the output check."""
    pauses = [round(r.pause_s, 3) for r in rounds if r.kind == "move"]
    floors = [round(r.pause_s, 3) for r in rounds if r.kind == "floor"]
    pause_median, pause_max = _stats(pauses)
    floor_median, floor_max = _stats(floors)
    ratio = round(pause_median / floor_median, 3) if pause_median is not None and floor_median else None
    return {
        "benchmark": "move",
        "moves": len(pauses),
        "pause_median_s": pause_median,
        "pause_max_s": pause_max,
        "floor_median_s": floor_median,
        "floor_max_s": floor_max,
        "ratio_median": ratio,
        "pauses": pauses,
        "floors": floors,
        "lost_results": lost,
        "duplicate_results": duplicates,
        "unexpected_results": extra,
        "pack_retries": int(sum(r.phases.get("pack_retries", 0) for r in rounds)),
        "expected_results": expected,
        "goal": {
            "pause_median_under_3s": pause_median is not None and pause_median < PAUSE_GOAL_S,
            "within_1_2x_floor": ratio is not None and ratio <= RATIO_GOAL,
        },
        "phases": {
            "move": _phase_medians([r for r in rounds if r.kind == "move"]),
            "floor": _phase_medians([r for r in rounds if r.kind == "floor"]),
        },
    }


# -- one side: a warm session and a task host ----------------------------------------------


class Side:
    """A process's SparkSession and SparkHost, with the steps a movement is made of.

    Every method takes and returns plain data, so a `RemoteSide` can call the same methods
    in another process.

    Attributes:
        name: how the benchmark calls this side.
        root: its own folder (checkpoints live under `root/checkpoints`).
        host: the SparkHost.
    """

    def __init__(self, name: str, root: str | Path, master: str, conf: dict[str, str]) -> None:
        from spark_agents.host import SparkHost
        from spark_agents.session import make_session

        self.name = name
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        from pyspark import SparkContext

        # A caller that already has a session (a test process) keeps it: it is reused, never stopped here.
        self._owns_session = SparkContext._active_spark_context is None
        self.spark = make_session(master, f"bpm-bench-move-{name}", conf)
        self.host = SparkHost(self.spark, self.root)

    def checkpoint_dir(self, task_id: str) -> Path:
        return self.root / "checkpoints" / task_id

    def _query(self, task_id: str):
        for task in self.host.tasks():
            if task.task_id == task_id and task.query is not None:
                return task.query
        raise MoveBenchError(f"task {task_id} is not running on {self.name}")

    def batches(self, task_id: str) -> list[Batch]:
        return [Batch(s.batch_id, s.start_s, s.end_s, s.rows) for s in self.host.recorder.samples() if s.task_id == task_id]

    def _batch(self, task_id: str, batch_id: int, timeout_s: float) -> Batch:
        """The recorded batch `batch_id` (the listener reports it shortly after the batch ends)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [b for b in self.batches(task_id) if b.batch_id == batch_id]
            if found:
                return found[-1]
            time.sleep(0.005)
        raise MoveBenchError(f"{self.name}: batch {batch_id} of {task_id} was never reported")

    def start(self, task_id: str, source: JetStreamInput, workload: Workload, trigger_s: float, epoch: int) -> dict[str, float]:
        """Start (or resume from this side's checkpoint) the task of `workload` at `epoch`, its results
        through the fence on the origin's broker; returns the seconds the start took and when it returned."""
        from spark_agents.broker.results import broker_sink

        query, params = workload.load()
        began = time.perf_counter()
        sink = broker_sink(source.connection(), task_id, epoch)
        self.host.start_task(task_id, source, self.checkpoint_dir(task_id), query, params, trigger_s, sink=sink)
        return {"start_s": time.perf_counter() - began, "started_at": time.time()}

    def wait_new_batch(self, task_id: str, after_batch_id: int, timeout_s: float) -> Batch:
        """Wait for the first batch after `after_batch_id` that read input, and return it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = first_new_batch(self.batches(task_id), after_batch_id)
            if found is not None:
                return found
            task = next((t for t in self.host.tasks() if t.task_id == task_id), None)
            if task is not None and task.state == "failed":
                raise MoveBenchError(f"{self.name}: task {task_id} failed: {task.error}")
            time.sleep(0.005)
        raise MoveBenchError(f"{self.name}: no batch with new input after batch {after_batch_id} within {timeout_s:.0f} s")

    def stop(self, task_id: str, timeout_s: float) -> tuple[Batch, dict[str, float]]:
        """Stop the task after its current batch; returns its last finished batch and the time from its end to stopped."""
        query = self._query(task_id)
        self.host.stop_task(task_id, timeout_s)
        stopped_at = time.time()
        progress = query.lastProgress
        if progress is None:
            raise MoveBenchError(f"{self.name}: task {task_id} stopped before finishing any batch")
        self.host.remove_task(task_id)
        last = self._batch(task_id, int(progress.batchId), timeout_s)
        # Counted from the end of the last batch: a batch that was running when the stop came
        # finishes first, and that is work done, not pause.
        return last, {"stop_s": stopped_at - last.end_s}

    def restart(self, task_id: str, source: JetStreamInput, workload: Workload, trigger_s: float, epoch: int,
                timeout_s: float) -> tuple[Batch, dict[str, float]]:
        """The floor: stop the task and start it again here from its own checkpoint, at the same epoch."""
        last, phases = self.stop(task_id, timeout_s)
        return last, {**phases, **self.start(task_id, source, workload, trigger_s, epoch)}

    def release(self, task_id: str, timeout_s: float) -> tuple[Batch, bytes, dict[str, float]]:
        """The origin's half of a movement: stop the task and pack its checkpoint."""
        from spark_agents.handover import pack_counting

        last, phases = self.stop(task_id, timeout_s)
        began = time.perf_counter()
        # Retries are counted so the race with Spark's state-store maintenance stays visible.
        data, retries = pack_counting(self.checkpoint_dir(task_id))
        return last, data, {**phases, "pack_s": time.perf_counter() - began, "checkpoint_bytes": float(len(data)),
                            "pack_retries": float(retries)}

    def receive(self, task_id: str, data: bytes, epoch: int, source: JetStreamInput, workload: Workload, trigger_s: float) -> dict[str, float]:
        """The partner's half of a movement: unpack the checkpoint into this side's folder and start the task at `epoch`."""
        from spark_agents.handover import unpack

        began = time.perf_counter()
        unpack(data, self.checkpoint_dir(task_id), epoch)
        return {"unpack_s": time.perf_counter() - began, **self.start(task_id, source, workload, trigger_s, epoch)}

    def drain(self, task_id: str, timeout_s: float) -> int:
        """Process everything the stream holds (closing every window), stop the task, return its batches."""
        query = self._query(task_id)
        worker = threading.Thread(target=query.processAllAvailable, name="bpm-move-drain", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            raise MoveBenchError(f"{self.name}: task {task_id} did not drain the stream within {timeout_s:.0f} s")
        self.stop(task_id, timeout_s)
        return len(self.batches(task_id))

    def close(self) -> None:
        self.host.close(stop_tasks=True)
        if self._owns_session:
            self.spark.stop()


# -- the other side, in a child process ----------------------------------------------------


class RemoteSide:
    """The same methods as `Side`, carried out by the worker process over an authenticated socket.

    Attributes:
        name: how the benchmark calls this side.
        process: the worker process (its own session, so its JVM is killed with it).
        log_path: the worker's stderr, quoted when it fails.
        hosts: where given, the worker runs in host `name` of them (`spark_agents.hosts`), and
            `kill` crashes that host.
    """

    def __init__(self, name: str, root: Path, master: str, conf: dict[str, str], timeout_s: float,
                 module: str = "bpm_app.bench.move", hosts: Hosts | None = None) -> None:
        self.name = name
        self.hosts = hosts
        self.log_path = root / f"{name}.log"
        root.mkdir(parents=True, exist_ok=True)
        key = secrets.token_bytes(32)
        address = hosts.add(name).address if hosts is not None else "127.0.0.1"
        # `module` runs the worker: its `main` serves a side class of its own through `_serve`.
        args = [sys.executable, "-m", module, "--worker", name, str(root / name), master, json.dumps(conf)]
        env = {**os.environ, _KEY_ENV: key.hex(), ADDRESS_ENV: address}
        with self.log_path.open("wb") as log:
            if hosts is not None:
                self.process = hosts.popen(name, args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env)
            else:
                self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env,
                                                start_new_session=True)
        self.conn: Connection | None = None
        try:
            port = self._read_port(timeout_s)
            self.conn = Client((address, port), authkey=key)
        except BaseException:
            self.kill()
            raise

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until the worker's Spark session is up (the caller can start its own meanwhile)."""
        self._receive("ready", timeout_s)

    def _read_port(self, timeout_s: float) -> int:
        stdout = self.process.stdout
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        line = stdout.readline().decode().strip() if ready else ""
        if not line.isdigit():
            raise MoveBenchError(f"worker {self.name} did not start: {line or 'no answer'}\n{self.log_tail()}")
        return int(line)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _receive(self, what: str, timeout_s: float) -> Any:
        assert self.conn is not None
        try:
            if not self.conn.poll(timeout_s):
                raise MoveBenchError(f"worker {self.name}: no answer to {what} within {timeout_s:.0f} s")
            status, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise MoveBenchError(f"worker {self.name} is gone ({exc!r}) during {what}\n{self.log_tail()}") from None
        if status != "ok":
            raise MoveBenchError(f"worker {self.name} failed in {what}:\n{value}")
        return value

    def call(self, method: str, *args: Any, timeout_s: float) -> Any:
        assert self.conn is not None
        self.conn.send((method, args))
        return self._receive(method, timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the worker to stop its tasks and session; kill it if it does not end in time."""
        try:
            if self.conn is not None and self.process.poll() is None:
                self.call("close", timeout_s=timeout_s)
                self.process.wait(timeout=timeout_s)
        except (MoveBenchError, OSError, subprocess.TimeoutExpired):
            pass
        finally:
            self.kill()

    def kill(self) -> None:
        """End the worker and everything in its session (its Spark JVM), if still there; in a
        host, the host crashes: every process in it is killed at once."""
        if self.conn is not None:
            self.conn.close()
        if self.hosts is not None:
            self.hosts.crash(self.name)
        elif self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _serve(name: str, root: str, master: str, conf: str, side_class: type = Side) -> None:
    """The worker: report a port on stdout, take one authenticated connection, run `side_class` methods for it."""
    key = bytes.fromhex(os.environ.pop(_KEY_ENV))
    with Listener((own_address(), 0), authkey=key) as listener:
        print(listener.address[1], flush=True)
        # Everything after the port (Spark's JVM inherits stdout) goes to the log, never into the pipe.
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        conn = listener.accept()
    side = side_class(name, root, master, json.loads(conf))
    conn.send(("ok", "ready"))
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            side.close()
            return
        try:
            conn.send(("ok", getattr(side, method)(*args)))
        except Exception:  # noqa: BLE001 - every failure goes back to the caller, which reports it
            conn.send(("error", traceback.format_exc()))
        if method == "close":
            return


# -- the feeder ----------------------------------------------------------------------------


class PacedFeed:
    """Appends a workload's generated records to a stream (folder or broker) at `speedup` times event time, a flush every `flush_s`.

    Attributes:
        fed: records handed to the feeder so far (the first `fed` of `settings.workload.records(...)`).
        feeder: the stream's `RecordFeeder` (lateness rule, files written).
        reached: per flush, when it returned (seconds since the epoch) and the newest event
            time admitted by then (microseconds): when the stream reached an event time.
    """

    def __init__(self, stream, settings: MoveSettings) -> None:
        from spark_agents.streams.feed import RecordFeeder

        self.feeder = RecordFeeder(stream, *settings.workload.load())
        self.settings = settings
        self.fed = 0
        self.reached: list[tuple[float, int]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bpm-move-feed", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            records = self.settings.workload.records(self.settings.rate, self.settings.seed)
            pending = next(records)
            first_us, began = pending[0], time.monotonic()
            while not self._stop.wait(self.settings.flush_s):
                horizon = first_us + (time.monotonic() - began) * self.settings.speedup * 1_000_000
                while pending[0] <= horizon:
                    self.feeder.add(pending)
                    self.fed += 1
                    pending = next(records)
                self.feeder.flush()
                if self.feeder.admission.newest_us is not None:
                    self.reached.append((time.time(), self.feeder.admission.newest_us))
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self.error = exc

    def stop(self) -> None:
        """Stop feeding (without an end mark)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def close(self) -> int:
        """Stop feeding and write the end-of-input mark; returns how many records were fed."""
        self.stop()
        if self.error is not None:
            raise MoveBenchError(f"the feeder failed: {self.error!r}")
        self.feeder.close()
        return self.fed


# -- the run -------------------------------------------------------------------------------


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def step_limits(timeout_s: float, step_timeout_s: float, error: Callable[[str], Exception]) -> Callable[[], float]:
    """A function that gives how long the next step may take: `step_timeout_s`, or what is
    left of the run's `timeout_s` if less; once the run's time is up it raises `error(message)`."""
    deadline = time.monotonic() + timeout_s

    def limit() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise error(f"the run passed its time limit of {timeout_s:.0f} s")
        return min(step_timeout_s, left)

    return limit


def run_move_bench(settings: MoveSettings, work_dir: str | Path, progress: Callable[[str, int], None] = lambda what, done: None) -> dict[str, Any]:
    """Run the benchmark in `work_dir` and return its figures (see `summarize`).

    `progress(what, rounds_done)` is called as the run goes; rounds count floor and movement
    rounds, warm-up included (`2 * (warmup + moves)` in all).
    """
    from bpm.keygroups import MAIN
    from spark_agents.broker.results import broker_outputs
    from spark_agents.broker.server import NatsServer, User
    from spark_agents.broker.subjects import partner_user
    from spark_agents.broker.source import JetStreamInput
    from spark_agents.broker.stream import Broker, BrokerStream
    from spark_agents.tls import own_certificate

    root = Path(work_dir)
    began = time.monotonic()
    step_limit = step_limits(settings.timeout_s, settings.step_timeout_s, MoveBenchError)
    load_before = load_average()

    origin, partner = User("a", secrets.token_urlsafe(16)), partner_user("b", secrets.token_urlsafe(16), [(TASK_ID, (MAIN, ""), True)])
    workload = settings.workload
    server: NatsServer | None = None
    broker: Broker | None = None
    remote: RemoteSide | None = None
    local: Side | None = None
    feed: PacedFeed | None = None
    try:
        progress("starting the origin's broker, the worker process and both Spark sessions", 0)
        # The origin's broker keeps its storage in a folder of the origin's own.
        served = own_certificate(root / "a", "a", ["127.0.0.1"]) if settings.tls else None
        server = NatsServer.on_free_ports("a", root / "a" / "broker", [origin, partner], tls=served).start()
        pem = None if served is None else served.pem
        sources = {user.name: JetStreamInput(server.url, user.name, user.password, "a", tls=pem) for user in (origin, partner)}
        broker = Broker(server.url, origin.name, origin.password, tls=pem)
        remote = RemoteSide("b", root, settings.master, settings.spark_conf(), step_limit())
        local = Side("a", root / "a", settings.master, settings.spark_conf())
        remote.wait_ready(step_limit())
        feed = PacedFeed(BrokerStream(broker, "a"), settings)
        feed.start()

        def call(side, method: str, *args: Any) -> Any:
            limit = step_limit()
            if isinstance(side, RemoteSide):
                return side.call(method, *args, timeout_s=limit + 30)
            return getattr(side, method)(*args)

        here, there = local, remote
        call(here, "start", TASK_ID, sources[here.name], workload, settings.trigger_s, 0)
        latest = call(here, "wait_new_batch", TASK_ID, -1, step_limit())
        resumed = {latest.batch_id}
        while latest.batch_id < settings.age_batches:
            progress(f"ageing the task: batch {latest.batch_id}/{settings.age_batches}", 0)
            latest = call(here, "wait_new_batch", TASK_ID, latest.batch_id, step_limit())  # first batches after a start, left out of the steady figure
        rounds: list[Round] = []
        epoch = 0
        for i in range(settings.warmup + settings.moves):
            measured = i >= settings.warmup
            label = f"round {i + 1 - settings.warmup}/{settings.moves}" if measured else f"warm-up {i + 1}/{settings.warmup}"
            # Stop right after a batch with input, as a movement would at its first chance.
            latest = call(here, "wait_new_batch", TASK_ID, latest.batch_id, step_limit())
            last, phases = call(here, "restart", TASK_ID, sources[here.name], workload, settings.trigger_s, epoch, step_limit())
            first = call(here, "wait_new_batch", TASK_ID, last.batch_id, step_limit())
            resumed.add(first.batch_id)
            if measured:
                rounds.append(measured_round("floor", here.name, here.name, last, first, phases))
            progress(f"{label}: floor restart on {here.name}", 2 * i + 1)
            latest = call(here, "wait_new_batch", TASK_ID, first.batch_id, step_limit())
            epoch += 1
            last, data, released = call(here, "release", TASK_ID, step_limit())
            received = call(there, "receive", TASK_ID, data, epoch, sources[there.name], workload, settings.trigger_s)
            first = call(there, "wait_new_batch", TASK_ID, last.batch_id, step_limit())
            resumed.add(first.batch_id)
            if measured:
                rounds.append(measured_round("move", here.name, there.name, last, first, {**released, **received}))
            progress(f"{label}: moved {here.name} -> {there.name}", 2 * i + 2)
            latest, here, there = first, there, here

        progress("closing the stream and draining the task", 2 * (settings.warmup + settings.moves))
        fed = feed.close()
        drain_began = time.monotonic()
        call(here, "drain", TASK_ID, step_limit())
        drain_s = time.monotonic() - drain_began
        steady = [b.end_s - b.start_s for side in (local, remote) for b in call(side, "batches", TASK_ID)
                  if b.rows > 0 and b.batch_id not in resumed]
        expected = workload.expected(settings.rate, settings.seed, fed, root / "reference")
        out = broker_outputs(broker, [TASK_ID])
        result = summarize(rounds, len(out.lost(expected)), len(out.duplicates), len(out.extra(expected)), len(expected))
        result.update({
            "steady_batch_median_s": _stats(steady)[0],
            "records_fed": fed,
            "drain_s": round(drain_s, 3),
            "elapsed_s": round(time.monotonic() - began, 3),
            "stream_messages": feed.feeder.files,
            "load_average_before": load_before,
            "load_average_after": load_average(),
            "settings": asdict(settings),
            "rounds": [{"kind": r.kind, "from": r.origin, "to": r.partner, "pause_s": round(r.pause_s, 3),
                        "last_batch": r.last.batch_id, "first_batch": r.first.batch_id,
                        **{k: round(v, 4) for k, v in r.phases.items()}} for r in rounds],
        })
        return result
    finally:
        if feed is not None:
            feed.stop()
        if remote is not None:
            remote.close()
        if local is not None:
            local.close()
        if broker is not None:
            broker.close()
        if server is not None:
            server.stop()


def plot_rounds(result: dict[str, Any], path: str | Path) -> Path:
    """A PNG with, per round, the floor restart and the movement as bars split into their steps, and the goals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.8))
    colours = plt.get_cmap("tab10")
    for offset, kind in ((-0.2, "floor"), (0.2, "move")):
        rounds = [r for r in result["rounds"] if r["kind"] == kind]
        x = [i + 1 + offset for i in range(len(rounds))]
        bottom = [0.0] * len(rounds)
        for n, step in enumerate(_STEPS + ("other_s",)):
            heights = [max(0.0, r.get(step, 0.0)) for r in rounds]
            label = step.removesuffix("_s").replace("_", " ") if kind == "move" else None
            ax.bar(x, heights, 0.38, bottom=bottom, color=colours(n), label=label, edgecolor="white", linewidth=0.5)
            bottom = [b + h for b, h in zip(bottom, heights)]
        for xi, total in zip(x, bottom):
            ax.text(xi, total, "F" if kind == "floor" else "M", ha="center", va="bottom", fontsize=7)
    ax.axhline(PAUSE_GOAL_S, color="red", linestyle=":", label=f"goal: median under {PAUSE_GOAL_S:g} s")
    if result["floor_median_s"]:
        ax.axhline(RATIO_GOAL * result["floor_median_s"], color="black", linestyle="--", linewidth=0.8,
                   label=f"{RATIO_GOAL:g} x floor median")
    ax.set_xticks(range(1, len(result["pauses"]) + 1))
    ax.set_xlabel("round (F: restart in one process, M: movement to the other process)")
    ax.set_ylabel("pause, s")
    ax.set_title(f"Task movement: median pause {result['pause_median_s']} s, floor median {result['floor_median_s']} s")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None, side_class: type = Side, description: str | None = None) -> None:
    """Entry point of a worker process (`python -m bpm_app.bench.move --worker NAME ROOT MASTER CONF_JSON`);
    other benchmarks pass their own `side_class`."""
    parser = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, metavar=("NAME", "ROOT", "MASTER", "CONF_JSON"), required=True)
    args = parser.parse_args(argv)
    _serve(*args.worker, side_class=side_class)


if __name__ == "__main__":
    # Run the worker through the package module, so the objects it sends back pickle as
    # `bpm_app.bench.move.*` (the caller's names) rather than `__main__.*`.
    from bpm_app.bench.move import main as worker_main

    worker_main()
