"""Loads from batch measurements, and when a load is fit to trade on (`bpm.load`)."""

import pytest

from bpm.load import (
    MAX_OVERHEAD_FACTOR,
    BatchSample,
    busy_seconds,
    cost_samples,
    default_load_window_s,
    default_startup_s,
    default_warmup_s,
    demand,
    interval_sample,
    overhead_factor,
    scaled_to_process,
    steady_window_start,
    still_rising,
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

    assert steady_window_start(100, 15, started_s=[10, 20], stopped_s=[50], startup_s=10) == 85, "nothing changed lately"
    assert steady_window_start(100, 15, started_s=[10, 82], stopped_s=[50], startup_s=10) == 92, "a task started at 82"
    assert steady_window_start(100, 15, started_s=[10], stopped_s=[95], startup_s=10) == 95, "a task stopped at 95"
    assert steady_window_start(100, 15, started_s=[97], stopped_s=[], startup_s=10) == 107, "still starting up: no window"


def test_demand_scales_the_load_of_a_task_that_falls_further_behind_each_batch():

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



def test_a_task_whose_input_began_after_its_start_up_rises_until_a_start_up_before_its_window():
    startup = 20.0
    # started at 0, first input at 50 (after the start-up, which ends at 20): rising while the
    # window begins before 70, and no longer once it begins later
    assert still_rising(0.0, 50.0, 60.0, startup)
    assert not still_rising(0.0, 50.0, 70.0, startup)
    # input from its first batches on: its start-up is left out of the window already
    assert not still_rising(0.0, 10.0, 25.0, startup)
    # no input yet: nothing to offer it at, and nothing rising
    assert not still_rising(0.0, None, 25.0, startup)


def test_the_warm_up_outlasts_a_load_window_past_the_last_task_start_up():
    """An agent's first load it trades on is measured on a whole load window of tasks past
    their start-up: at a 10 s trigger 20 s of start-up and a 30 s window; never less than the
    JVM's own warm-up."""
    for trigger in (0.5, 1.0, 5.0, 10.0, 30.0):
        warm = default_warmup_s(trigger)
        assert warm >= default_startup_s(trigger) + default_load_window_s(trigger) and warm >= 30.0
    assert (default_warmup_s(1.0), default_warmup_s(10.0)) == (30.0, 50.0)
