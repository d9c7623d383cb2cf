import os

import pytest

from spark_agents.metrics import BatchSample, busy_seconds, cost_samples, interval_sample, process_cpu_seconds, task_loads


def b(task, start, duration, rows=10, batch=0):
    return BatchSample(task, batch, start, duration, rows)


def test_busy_time_counts_only_the_part_of_each_batch_inside_the_interval():
    samples = [b("a", 8, 4), b("a", 13, 1), b("b", 19, 5), b("c", 30, 1)]
    assert busy_seconds(samples, 10, 20) == {"a": 3.0, "b": 1.0}


def test_load_is_busy_time_per_second_over_cores_and_idle_tasks_get_zero():
    loads = task_loads([b("a", 0, 5), b("b", 2, 2)], 0, 10, cores=2, tasks=["a", "b", "idle"])
    assert loads == {"a": 0.25, "b": 0.1, "idle": 0.0}
    with pytest.raises(ValueError):
        task_loads([], 5, 5, 2)
    with pytest.raises(ValueError):
        task_loads([], 0, 5, 0)


def test_interval_sample_and_cost_samples():
    samples = [b("a", 0, 2, rows=100), b("a", 4, 4, rows=50), b("b", 9, 3)]
    interval = interval_sample(samples, 0, 10, cores=2, tasks=["a", "b"], cpu_seconds=7.0)
    assert interval.loads == {"a": 0.3, "b": 0.05}
    assert interval.utilisation == pytest.approx(0.35) and interval.cpu_utilisation == 0.35
    assert interval.batches == 2 and interval.rows == 150 and interval.mean_batch_s == 3.0
    idle = interval_sample([], 10, 20, cores=2)
    assert idle.mean_batch_s is None and idle.cpu_utilisation is None
    assert cost_samples([interval, idle]) == ([pytest.approx(0.35)], [3.0])


def test_process_cpu_of_this_process_is_readable_and_grows():
    before = process_cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    after = process_cpu_seconds(os.getpid())
    assert before is not None and after > before
    assert process_cpu_seconds(2**22 + 12345) is None
