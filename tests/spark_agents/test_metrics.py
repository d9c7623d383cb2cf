"""Reading CPU time from /proc (`spark_agents.metrics`)."""

import os
import subprocess
import sys
import time

from spark_agents.metrics import (
    CpuSeries,
    process_cpu_seconds,
    process_tree_cpu_seconds,
)


def test_process_cpu_of_this_process_is_readable_and_grows():
    before = process_cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    after = process_cpu_seconds(os.getpid())
    assert before is not None and after > before
    assert process_cpu_seconds(2**22 + 12345) is None


def test_process_tree_cpu_counts_the_live_children_of_a_process():
    """A server's workers are its children: their CPU counts with the server's."""
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        deadline = time.monotonic() + 20
        while (process_cpu_seconds(child.pid) or 0.0) < 0.45 and time.monotonic() < deadline:
            time.sleep(0.1)
        own = process_cpu_seconds(os.getpid())
        tree = process_tree_cpu_seconds(os.getpid())
        assert tree is not None and own is not None
        assert tree - own >= 0.4, (own, tree)
    finally:
        child.kill()
        child.wait()
    assert process_tree_cpu_seconds(child.pid) is None, "a process that is gone is unreadable"


def test_process_tree_cpu_counts_descendants_that_have_exited():
    """Spark's Python planners and workers come and go under its JVM: their CPU counts once they are gone too."""
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {burn!r}]); "
                                                     "print(flush=True); time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert parent.stdout.readline() == b"\n", "the child has burnt its CPU and exited"
        own = process_cpu_seconds(parent.pid)
        assert process_tree_cpu_seconds(parent.pid) - own >= 0.4, "the exited child's CPU is its parent's"
    finally:
        parent.kill()
        parent.wait()


def test_a_cpu_series_never_goes_back_when_a_process_leaves_the_tree():
    series = CpuSeries()
    readings = [10.0, 12.0, 6.5, 7.0, 9.0]  # a process with 5.5 s left the tree between the second and third
    values = [series.reading(r) for r in readings]
    assert values == [10.0, 12.0, 12.0, 12.5, 14.5], "no interval with negative CPU, and later ones as they were"


def test_the_machine_s_cpu_is_read_from_proc_stat_and_shared_between_readings():
    from spark_agents.metrics import _CLOCK_TICKS, machine_cpu

    def stat(user, idle, iowait, steal):
        # cpu  user nice system idle iowait irq softirq steal guest guest_nice, then one line per CPU
        return (f"cpu  {user} 0 0 {idle} {iowait} 0 0 {steal} 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\ncpu1 1 0 0 1 0 0 0 0 0 0\n"
                "intr 5\nctxt 9\n")

    before, after = machine_cpu(stat(100, 300, 0, 0)), machine_cpu(stat(250, 330, 20, 20))
    assert (before.cpus, before.busy_s, before.total_s) == (2, 100 / _CLOCK_TICKS, 400 / _CLOCK_TICKS)
    # 220 ticks passed: 150 user and 20 stolen count busy, 30 idle and 20 waiting for I/O do not
    assert after.since(before) == {"busy": round(170 / 220, 3), "steal": round(20 / 220, 3)}
    assert before.since(before) == {"busy": 0.0, "steal": 0.0}
    live = machine_cpu()
    assert live.cpus == os.cpu_count() and 0 < live.busy_s <= live.total_s


def test_spark_cpu_reads_a_jvm_tree_as_a_series_and_none_once_it_is_gone():
    from spark_agents.metrics import SparkCpu

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE)
    spark_cpu = SparkCpu(child.pid)
    first = spark_cpu.seconds()
    assert first is not None and first >= time.process_time() - 1e-3, "the tree and this process (the driver's Python side)"
    child.communicate(b"\n", timeout=10)
    assert spark_cpu.seconds() is None, "a JVM that is gone is unreadable, not no CPU"
