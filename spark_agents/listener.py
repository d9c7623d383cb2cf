"""Measuring the host's tasks: a StreamingQueryListener that records every finished micro-batch,
with the CPU time the batch used.

A batch's CPU time is the sum of three parts, each read from where it is spent:

* the task's stream execution thread in the driver JVM (planning, state commits, offset logs),
  from the JVM's ThreadMXBean;
* the executor tasks of the batch's Spark jobs (Spark puts every job of a query run in a job
  group named after the run id), from Spark's status store (`executorCpuTime`), local or remote;
* the `foreachBatch` function in this Python process, measured by `BatchWriter`.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql.streaming import StreamingQueryListener

from bpm.load import BatchSample

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_DONE = ("SUCCEEDED", "FAILED")


class TaskCpuMeter:
    """CPU seconds used by each micro-batch of the session's streaming queries (see the module text)."""

    def __init__(self, spark: SparkSession) -> None:
        sc = spark.sparkContext
        self._tracker = sc._jsc.statusTracker()
        self._arrays = sc._jvm.java.util.Arrays
        self._store = sc._jsc.sc().statusStore()
        self._threads = sc._jvm.java.lang.management.ManagementFactory.getThreadMXBean()
        self._lock = threading.Lock()
        self._counted_jobs: dict[str, set[int]] = {}
        self._thread: dict[str, int | None] = {}
        self._thread_cpu_ns: dict[str, int] = {}
        self._python: dict[tuple[str, int], float] = {}

    def record_python(self, task_id: str, batch_id: int, seconds: float) -> None:
        """CPU seconds the batch's foreachBatch function used in this process."""
        with self._lock:
            self._python[(task_id, batch_id)] = self._python.get((task_id, batch_id), 0.0) + seconds

    def _stream_thread(self, run_id: str) -> int | None:
        if run_id not in self._thread:
            marker = f"runId = {run_id}]"
            found = None
            for info in self._threads.getThreadInfo(self._threads.getAllThreadIds()):
                if info is not None and marker in info.getThreadName():
                    found = info.getThreadId()
                    break
            self._thread[run_id] = found
        return self._thread[run_id]

    def _thread_seconds(self, run_id: str) -> float:
        thread = self._stream_thread(run_id)
        if thread is None:
            return 0.0
        now = self._threads.getThreadCpuTime(thread)
        if now < 0:  # the thread ended
            return 0.0
        before = self._thread_cpu_ns.get(run_id, 0)
        self._thread_cpu_ns[run_id] = now
        return (now - before) / 1e9

    def _ints(self, java_array) -> list[int]:
        # One Py4J call for the whole array: iterating a Java array from Python costs one call per element.
        text = self._arrays.toString(java_array)
        return [int(x) for x in text.strip("[]").split(",") if x.strip()]

    def _executor_seconds(self, run_id: str) -> float:
        counted = self._counted_jobs.setdefault(run_id, set())
        total_ns = 0
        for job in self._ints(self._tracker.getJobIdsForGroup(run_id)):
            if job in counted:
                continue
            info = self._tracker.getJobInfo(job)
            if info is None or info.status().name() not in _DONE:
                continue  # the next batch's job, or still running: counted with a later batch
            counted.add(job)
            for stage in self._ints(info.stageIds()):
                try:
                    total_ns += self._store.lastStageAttempt(stage).executorCpuTime()
                except Exception:  # noqa: BLE001 - a stage the store no longer keeps or never ran
                    continue
        return total_ns / 1e9

    def batch_seconds(self, task_id: str, run_id: str, batch_id: int) -> float:
        """CPU seconds of one finished batch; call once per batch, in batch order."""
        with self._lock:
            python = self._python.pop((task_id, batch_id), 0.0)
            return self._thread_seconds(run_id) + self._executor_seconds(run_id) + python

    def forget(self, run_id: str) -> None:
        with self._lock:
            for table in (self._counted_jobs, self._thread, self._thread_cpu_ns):
                table.pop(run_id, None)


class _JsonBridge:
    """The Java side of `BatchRecorder`: takes each progress event as one JSON string.

    PySpark's own bridge converts every field of an event through a separate Py4J call
    (well over a hundred per batch for a stateful query); `progress().json()` is one call.
    """

    def __init__(self, recorder: BatchRecorder) -> None:
        self.recorder = recorder

    def onQueryStarted(self, jevent) -> None:  # noqa: N802 - the Java interface's names
        pass

    def onQueryProgress(self, jevent) -> None:  # noqa: N802
        self.recorder.record(json.loads(jevent.progress().json()))

    def onQueryIdle(self, jevent) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, jevent) -> None:  # noqa: N802
        self.recorder.terminated(jevent.runId().toString())

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class BatchRecorder(StreamingQueryListener):
    """A StreamingQueryListener that keeps the last `capacity` batch samples of every named query.

    Register it with `spark.streams.addListener`. Spark calls it on its listener thread;
    readers take a copy under the lock.

    Attributes:
        cpu: measures each batch's CPU time (None: batches are recorded without it).
        on_batch: optional callback with each new sample and the source's end offset (called outside the lock).
        accept: optional filter on the query run id (a session's listeners see every query of the session).
    """

    def __init__(
        self,
        cpu: TaskCpuMeter | None = None,
        capacity: int = 20_000,
        on_batch: Callable[[BatchSample, dict | None], None] | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._samples: deque[BatchSample] = deque(maxlen=capacity)
        self.cpu = cpu
        self.on_batch = on_batch
        self.accept = accept

    @property
    def _jlistener(self):
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(_JsonBridge(self))
        return self._jlistenerobj

    # PySpark's listener interface; events arrive through `record` and `terminated` instead.
    def onQueryStarted(self, event) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event) -> None:  # noqa: N802
        pass

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        pass

    def terminated(self, run_id: str) -> None:
        if self.cpu is not None:
            self.cpu.forget(run_id)

    def record(self, progress: dict) -> None:
        """Record one progress event (Spark's `StreamingQueryProgress` as JSON)."""
        name, run_id = progress.get("name"), str(progress.get("runId"))
        if not name or (self.accept is not None and not self.accept(run_id)):
            return
        batch_id = int(progress["batchId"])
        start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
        sample = BatchSample(
            task_id=name,
            batch_id=batch_id,
            start_s=start,
            duration_s=progress.get("durationMs", {}).get("triggerExecution", 0) / 1000.0,
            rows=int(progress.get("numInputRows") or 0),
            cpu_s=self.cpu.batch_seconds(name, run_id, batch_id) if self.cpu else None,
        )
        with self._lock:
            self._samples.append(sample)
        if self.on_batch is not None:
            sources = progress.get("sources") or []
            self.on_batch(sample, _end_offset(sources[0].get("endOffset")) if sources else None)

    def samples(self, since_s: float = 0.0) -> list[BatchSample]:
        """Samples of batches that ended after `since_s`, oldest first."""
        with self._lock:
            return [s for s in self._samples if s.end_s > since_s]


def _end_offset(offset) -> dict | None:
    if offset is None:
        return None
    if isinstance(offset, str):
        try:
            return json.loads(offset)
        except ValueError:
            return None
    return offset if isinstance(offset, dict) else None
