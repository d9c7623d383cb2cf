"""Reading CPU time: the machine's, a local process's and its tree's, a participant's Spark's
(from /proc). What the readings become, loads and samples, is `bpm.load`."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class MachineCpu:
    """CPU seconds of the whole machine since boot, summed over its CPUs (from /proc/stat)."""

    busy_s: float  # running anything: user, nice, system, interrupts, and steal
    steal_s: float  # a virtual machine's CPUs waiting while the hypervisor ran something else
    total_s: float  # busy, idle and waiting for I/O
    cpus: int

    def since(self, earlier: MachineCpu) -> dict[str, float]:
        """The share of the machine's CPUs busy, and stolen, between `earlier` and this reading."""
        span = self.total_s - earlier.total_s
        if span <= 0:
            return {"busy": 0.0, "steal": 0.0}
        return {"busy": round((self.busy_s - earlier.busy_s) / span, 3), "steal": round((self.steal_s - earlier.steal_s) / span, 3)}


def machine_cpu(stat_text: str | None = None) -> MachineCpu:
    """The machine's CPU times now (`stat_text`: the contents of /proc/stat, read when None)."""
    if stat_text is None:
        stat_text = Path("/proc/stat").read_text()
    lines = stat_text.splitlines()
    # cpu  user nice system idle iowait irq softirq steal guest guest_nice (guest time is in user)
    ticks = [int(f) for f in lines[0].split()[1:9]]
    ticks += [0] * (8 - len(ticks))
    idle = ticks[3] + ticks[4]
    total = sum(ticks)
    cpus = sum(1 for line in lines if re.match(r"cpu\d+ ", line))
    return MachineCpu((total - idle) / _CLOCK_TICKS, ticks[7] / _CLOCK_TICKS, total / _CLOCK_TICKS, cpus)


def process_cpu_seconds(pid: int, reaped: bool = False) -> float | None:
    """User plus system CPU seconds of a local process (from /proc), None where unreadable;
    with `reaped`, plus those of its descendants that have exited and been waited for."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # Fields after the command name: state is [0], utime [11], stime [12], cutime [13], cstime [14].
    return sum(int(f) for f in fields[11:15 if reaped else 13]) / _CLOCK_TICKS


def process_tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a local process and of all its descendants, live and exited (a server's
    worker processes; Spark's Python workers and planners under its JVM), None where the
    process is unreadable. A descendant's time moves from the live ones to its parent's
    count of exited children when it is waited for, so the sum only grows."""
    own = process_cpu_seconds(pid, reaped=True)
    if own is None:
        return None
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children += [int(c) for c in task.read_text().split()]
        except OSError:
            continue
    return own + sum(process_tree_cpu_seconds(c) or 0.0 for c in children)


def spark_cpu_seconds(jvm_pid: int) -> float | None:
    """CPU seconds a participant's Spark has used: its local JVM with every Python process under
    it (the broker source reads in them), and this process (the driver's Python side); None
    where the JVM is unreadable."""
    jvm = process_tree_cpu_seconds(jvm_pid)
    return None if jvm is None else jvm + time.process_time()


@dataclass
class CpuSeries:
    """A process tree's CPU seconds (`process_tree_cpu_seconds`) as a series that never goes back.

    When a process of the tree exits, its time drops out of the reading: in the runs
    measured it did not come back as its parent's count of exited children, by up to 5 CPU
    seconds at once (a query's Python planner, a worker), which made an interval's CPU
    negative and a participant's load read a tenth of itself for 40 s. A drop is added back
    to every later reading; only what the process used since the reading before is lost.

    Attributes:
        high: the last value returned.
        lost: what drops have taken so far.
    """

    high: float = 0.0
    lost: float = 0.0

    def reading(self, raw: float) -> float:
        cpu = raw + self.lost
        if cpu < self.high:
            self.lost += self.high - cpu
            cpu = self.high
        self.high = cpu
        return cpu


@dataclass
class SparkCpu:
    """The CPU seconds a participant's Spark has used so far (`spark_cpu_seconds` of its local
    JVM), read as a `CpuSeries`: a Python worker that exits does not take its time back."""

    jvm_pid: int
    series: CpuSeries = field(default_factory=CpuSeries)

    def seconds(self) -> float | None:
        """None where the JVM can no longer be read."""
        raw = spark_cpu_seconds(self.jvm_pid)
        return None if raw is None else self.series.reading(raw)
