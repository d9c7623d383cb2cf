import os
import subprocess
import sys
import time

import pytest

from spark_agents.metrics import (
    CpuSeries,
    MAX_OVERHEAD_FACTOR,
    BatchSample,
    busy_seconds,
    cost_samples,
    interval_sample,
    overhead_factor,
    process_cpu_seconds,
    process_tree_cpu_seconds,
    task_loads,
)


def b(task, start, duration, rows=10, batch=0, cpu=None):
    return BatchSample(task, batch, start, duration, rows, cpu)


def test_busy_time_counts_only_the_part_of_each_batch_inside_the_interval():
    samples = [b("a", 8, 4), b("a", 13, 1), b("b", 19, 5), b("c", 30, 1)]
    assert busy_seconds(samples, 10, 20) == {"a": 3.0, "b": 1.0}


def test_cpu_time_is_spread_over_the_batch_and_wall_time_stays_available():
    samples = [b("a", 8, 4, cpu=2.0), b("a", 12, 0, cpu=0.5), b("b", 19, 2, cpu=None)]
    assert busy_seconds(samples, 10, 20) == {"a": 1.5, "b": 1.0}
    assert busy_seconds(samples, 10, 20, wall=True) == {"a": 2.0, "b": 1.0}


def test_load_is_busy_time_per_second_over_cpus_and_idle_tasks_get_zero():
    loads = task_loads([b("a", 0, 5), b("b", 2, 2)], 0, 10, cpus=2, tasks=["a", "b", "idle"])
    assert loads == {"a": 0.25, "b": 0.1, "idle": 0.0}
    with pytest.raises(ValueError):
        task_loads([], 5, 5, 2)
    with pytest.raises(ValueError):
        task_loads([], 0, 5, 0)


def test_interval_sample_and_cost_samples():
    samples = [b("a", 0, 2, rows=100, cpu=1.0), b("a", 4, 4, rows=50, cpu=2.0), b("b", 9, 3, cpu=0.3)]
    unscaled = interval_sample(samples, 0, 10, cpus=2, tasks=["a", "b"])
    assert unscaled.loads == {"a": 0.15, "b": pytest.approx(0.005)} and unscaled.cpu_utilisation is None
    assert unscaled.utilisation == unscaled.task_cpu_utilisation == pytest.approx(0.155)
    assert overhead_factor([unscaled]) == 1.0, "no process CPU measured"
    measured = interval_sample(samples, 0, 10, cpus=2, tasks=["a", "b"], cpu_seconds=6.2)
    assert overhead_factor([measured, unscaled]) == pytest.approx(2.0)
    odd = interval_sample(samples, 0, 10, cpus=2, tasks=["a", "b"], cpu_seconds=31.0)
    assert overhead_factor([measured, odd, measured]) == pytest.approx(2.0), "the median ignores one odd interval"
    assert overhead_factor([odd]) == MAX_OVERHEAD_FACTOR, "a warming-up process does not inflate loads without bound"
    interval = interval_sample(samples, 0, 10, cpus=2, tasks=["a", "b"], cpu_seconds=6.2, factor=2.0)
    assert interval.loads == {"a": pytest.approx(0.3), "b": pytest.approx(0.01)}, "task CPU scaled by the factor"
    assert interval.utilisation == pytest.approx(0.31) == interval.cpu_utilisation
    assert interval.task_cpu_utilisation == pytest.approx(0.155) and interval.wall_utilisation == pytest.approx(0.35)
    assert interval.batches == 2 and interval.rows == 150 and interval.mean_batch_s == 3.0
    idle = interval_sample([], 10, 20, cpus=2)
    assert idle.mean_batch_s is None and idle.cpu_utilisation is None
    assert cost_samples([interval, idle]) == ([pytest.approx(0.31)], [3.0])


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


def test_overhead_factor_leaves_the_idle_part_of_the_process_cpu_to_no_task():
    # Process CPU = 0.1 (idle JVM) + 1.5 x task CPU, over intervals of varying task work.
    history = [
        interval_sample([b("a", 0, 10, cpu=c)], 0, 10, cpus=1, tasks=["a"], cpu_seconds=10 * (0.1 + 1.5 * c / 10))
        for c in (0.5, 1.0, 2.0, 3.0, 1.5, 0.8, 2.5, 4.0)
    ]
    assert overhead_factor(history) == pytest.approx(1.5)
    ratios = [i.cpu_utilisation / i.task_cpu_utilisation for i in history]
    assert min(ratios) > 1.7, "a plain ratio would charge the idle JVM to the tasks"
    # A warm-up interval (much process CPU, little task CPU) does not set it.
    warm_up = interval_sample([b("a", 0, 10, cpu=0.2)], 0, 10, cpus=1, tasks=["a"], cpu_seconds=8.0)
    assert overhead_factor([warm_up, *history]) == pytest.approx(1.5, rel=0.05)


def test_loads_scaled_to_the_process_cpu_of_the_window():
    from spark_agents.metrics import scaled_to_process

    history = [interval_sample([b("a", 0, 10, cpu=1.0)], 0, 10, cpus=1, tasks=["a"], cpu_seconds=4.0),
               interval_sample([b("a", 10, 10, cpu=1.0)], 10, 20, cpus=1, tasks=["a"], cpu_seconds=2.0)]
    loads = {"a": 0.3, "b": 0.1}
    assert scaled_to_process(loads, history, start_s=10) == {"a": pytest.approx(0.15), "b": pytest.approx(0.05)}
    assert sum(scaled_to_process(loads, history, start_s=0).values()) == pytest.approx(0.3), "both intervals: 6 s over 20 s"
    assert scaled_to_process(loads, history, start_s=30) == loads, "nothing measured in the window"
    assert scaled_to_process({"a": 0.0}, history, start_s=0) == {"a": 0.0}
    # An interval counts for its part inside the window: 5 s at 0.4 and 10 s at 0.2.
    assert sum(scaled_to_process(loads, history, start_s=5).values()) == pytest.approx((5 * 0.4 + 10 * 0.2) / 15)


def test_a_steady_window_starts_after_the_last_change_and_every_start_up():
    from spark_agents.metrics import steady_window_start

    assert steady_window_start(100, 15, started_s=[10, 20], stopped_s=[50], startup_s=10) == 85, "nothing changed lately"
    assert steady_window_start(100, 15, started_s=[10, 82], stopped_s=[50], startup_s=10) == 92, "a task started at 82"
    assert steady_window_start(100, 15, started_s=[10], stopped_s=[95], startup_s=10) == 95, "a task stopped at 95"
    assert steady_window_start(100, 15, started_s=[97], stopped_s=[], startup_s=10) == 107, "still starting up: no window"


def test_demand_scales_the_load_of_a_task_that_falls_further_behind_each_batch():
    from spark_agents.metrics import demand

    # "slow" gets 4/5 of what it needs: each batch starts when the one before ends and takes 1.25x as long.
    slow = [b("slow", 0, 4, cpu=0.4), b("slow", 4, 5, cpu=0.5), b("slow", 9, 6.25, cpu=0.6), b("slow", 15.25, 7.8, cpu=0.8)]
    # "big" keeps up with batches longer than its trigger: each reads what came during the one before, in as long.
    big = [b("big", 0, 5, cpu=0.5), b("big", 5, 5, cpu=0.5), b("big", 10, 5, cpu=0.5)]
    fast = [b("fast", 0, 1, cpu=0.5), b("fast", 2, 30, cpu=0.5), b("fast", 32, 1, cpu=0.5), b("fast", 34, 1, cpu=0.5)]
    loads = {"slow": 0.1, "big": 0.2, "fast": 0.05, "idle": 0.0}
    out = demand(loads, slow + big + fast, {"slow": 2.0, "big": 2.0, "fast": 2.0, "idle": 2.0})
    assert out["slow"] == pytest.approx(0.125, rel=0.01), "needs 1.25x what it gets"
    assert out["big"] == 0.2, "steady batches longer than the trigger: it keeps up, its load is what it gets"
    assert out["fast"] == 0.05, "one catch-up batch is not the rule"
    assert out["idle"] == 0.0
    assert demand(loads, slow, {"slow": None})["slow"] == 0.1, "no trigger: back-to-back batches are the plan"


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
