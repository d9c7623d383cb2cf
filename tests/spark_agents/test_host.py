"""The task host on the shared local session: movement at batch boundaries, measurements, HTTP
status; tasks read a participant's broker stream and write through the fence on it."""

import time

import httpx
import pytest

from bpm.costs import CostFunction
from spark_agents.broker.results import broker_outputs, broker_sink, read_results
from spark_agents.broker.source import JetStreamInput
from spark_agents.broker.stream import BrokerStream
from tests.spark_agents.conns import Feeder, end_mark_us, end_watermark_ms, feed_all
from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from examples.network_monitoring import bind, expected
from examples.network_monitoring import query as MONITORING
from spark_agents.checkpoint import committed_watermark_ms, owes_watermark_batch
from spark_agents.handover import pack, unpack
from spark_agents.host import TaskError, SparkHost
from bpm.load import IntervalSample
from spark_agents.query import staggered_trigger_s
from spark_agents.status import StatusServer

PARAMS = QueryParams(window_s=30, min_connections=30, min_ports=10, lateness_s=10)


def wait_for(condition, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture
def host(spark, tmp_path):
    h = SparkHost(spark, tmp_path / "work", interval_s=1.0)
    yield h
    h.close()


@pytest.fixture
def source(nats_server):
    """Participant a's key groups `prefix` of its stream, read as its owner."""
    server, owner = nats_server
    return lambda prefix="": JetStreamInput(server.url, owner.name, owner.password, "a", prefix)


def sink(broker, task_id, epoch=0):
    return broker_sink(broker, task_id, epoch)


def test_a_task_moved_at_a_batch_boundary_loses_and_duplicates_nothing(spark, host, tmp_path, broker, source):
    conns = generate(TrafficProfile(duration_s=240, rate=60, sources=100), seed=21)
    feeder = Feeder(BrokerStream(broker, "a"), PARAMS)
    half = len(conns) // 2
    feeder.feed(conns[:half], 2000)
    task = host.start_task("a.p0", source(), query=MONITORING, params=bind(PARAMS), trigger_s=0.2, sink=sink(broker, "a.p0", 1))
    last = broker.last_seq()
    wait_for(lambda: task.position == last)
    assert task.batches > 0 and task.rows > 0 and host.tasks()[0].state == "running"

    checkpoint = host.stop_task("a.p0")
    assert host.tasks()[0].state == "stopped" and host.running() == []
    unpack(pack(checkpoint), tmp_path / "elsewhere", epoch=2)  # the checkpoint crosses as bytes
    before = broker_outputs(broker, ["a.p0"])

    feeder.feed(conns[half:], 2000)
    feeder.close()
    other = SparkHost(spark, tmp_path / "other", interval_s=1.0)
    try:
        resumed = other.start_task("a.p0", source(), tmp_path / "elsewhere", query=MONITORING, params=bind(PARAMS), trigger_s=0.2, sink=sink(broker, "a.p0", 2))
        assert resumed.position == last, "resumes after the sequence the first host read up to"
        resumed.query.processAllAvailable()
        after = broker_outputs(broker, ["a.p0"])
        assert after.rows == set(expected(conns, PARAMS))
        assert after.duplicates == [] and before.rows <= after.rows
        batches = read_results(broker, "a.p0")
        assert min(b.batch_id for b in batches if b.epoch == 2) > max((b.batch_id for b in batches if b.epoch == 1), default=-1), \
            "batch ids continue after the move"
    finally:
        other.close()


def test_a_checkpoint_packed_for_a_handover_resumes_without_its_history(spark, host, tmp_path, broker, source):
    """After a few dozen batches, the packed checkpoint leaves out history and checksum files,
    and the task resumes from it exactly."""
    conns = generate(TrafficProfile(duration_s=240, rate=60, sources=100), seed=22)
    feeder = Feeder(BrokerStream(broker, "a"), PARAMS)
    half = len(conns) // 2
    task = host.start_task("a.p0", source(), query=MONITORING, params=bind(PARAMS), trigger_s=0.1, sink=sink(broker, "a.p0", 1))
    step = half // 24
    for start in range(0, step * 24, step):  # one flush, and one batch, at a time
        feeder.feed(conns[start:start + step], step + 1)
        last = broker.last_seq()
        wait_for(lambda: task.position == last)
    feeder.feed(conns[step * 24:half], half)
    last = broker.last_seq()
    wait_for(lambda: task.position == last)
    assert task.batches >= 24
    checkpoint = host.stop_task("a.p0")
    everything = [p for p in checkpoint.rglob("*") if p.is_file()]
    unpack(pack(checkpoint), tmp_path / "elsewhere", epoch=1)
    shipped = [p for p in (tmp_path / "elsewhere").rglob("*") if p.is_file()]
    assert len(shipped) < len(everything) / 3, (len(shipped), len(everything))
    assert not [p for p in shipped if p.name.endswith(".crc")]
    # The newest commit, and the offset entries from the one before it on (a batch planned but
    # not committed makes three): what a restart reads, and a copy cut at that commit too.
    offsets = sorted(int(p.name) for p in (tmp_path / "elsewhere" / "offsets").iterdir())
    commits = sorted(int(p.name) for p in (tmp_path / "elsewhere" / "commits").iterdir())
    assert len(commits) == 1 and offsets == list(range(commits[0] - 1, offsets[-1] + 1)) and len(offsets) in (2, 3), (offsets, commits)

    feeder.feed(conns[half:], 2000)
    feeder.close()
    other = SparkHost(spark, tmp_path / "other", interval_s=1.0)
    try:
        resumed = other.start_task("a.p0", source(), tmp_path / "elsewhere", query=MONITORING, params=bind(PARAMS), trigger_s=0.2, sink=sink(broker, "a.p0", 1))
        assert resumed.position == last
        resumed.query.processAllAvailable()
        after = broker_outputs(broker, ["a.p0"])
        assert after.rows == set(expected(conns, PARAMS)) and after.duplicates == []
    finally:
        other.close()


def test_a_task_stopped_before_its_last_windows_emits_them_where_it_resumes(spark, host, tmp_path, broker, source):
    """Spark runs the batch that the end mark's watermark owes only after a batch of the same
    run; a task stopped just after reading the end mark, resumed elsewhere with nothing new to
    read, runs it all the same (its source plans a batch without rows) and emits its last windows."""
    conns = generate(TrafficProfile(duration_s=120, rate=40, sources=50), seed=23)
    feeder = feed_all(BrokerStream(broker, "a"), conns, PARAMS)
    last = broker.last_seq()
    # The stop must land between the batch that reads the end mark and the next trigger's,
    # which runs the watermark's batch. Spark runs the first batch at once and the next at the
    # following multiple of the interval since the epoch: the task starts early in an interval,
    # so the first batch, Spark's progress listener (late on a busy machine) and the stop have
    # most of an interval, whatever the phase the test began at.
    interval_s = staggered_trigger_s("a.p0", 20.0)
    if time.time() % interval_s > interval_s / 4:
        time.sleep(interval_s - time.time() % interval_s)
    task = host.start_task("a.p0", source(), query=MONITORING, params=bind(PARAMS), trigger_s=20.0, sink=sink(broker, "a.p0", 1))
    assert task.trigger_s == interval_s
    wait_for(lambda: task.position == last)  # the batch that read the end mark
    checkpoint = host.stop_task("a.p0")
    assert owes_watermark_batch(checkpoint), "stopped before the batch of its new watermark"
    end_ms = end_watermark_ms(end_mark_us(feeder.admission.newest_us, PARAMS), PARAMS)
    assert (committed_watermark_ms(checkpoint) or 0) < end_ms
    unpack(pack(checkpoint), tmp_path / "elsewhere", epoch=2)

    other = SparkHost(spark, tmp_path / "other", interval_s=1.0)
    try:
        resumed = other.start_task("a.p0", source(), tmp_path / "elsewhere", query=MONITORING, params=bind(PARAMS), trigger_s=0.2, sink=sink(broker, "a.p0", 2))
        wait_for(lambda: committed_watermark_ms(tmp_path / "elsewhere") == end_ms and resumed.batches, timeout_s=60)
        time.sleep(1.0)
        batches = resumed.batches
        time.sleep(1.5)
        assert resumed.batches == batches and resumed.rows == 0, "batches without rows, then none while nothing new comes"
        after = broker_outputs(broker, ["a.p0"])
        assert after.rows == set(expected(conns, PARAMS)) and after.duplicates == []
    finally:
        other.close()


def test_measurements_status_and_http(host, broker, source):
    feed_all(BrokerStream(broker, "a"), generate(TrafficProfile(duration_s=120, rate=40, sources=50), seed=22), PARAMS)
    host.sample()
    for k in range(2):
        host.start_task(f"p{k}", source(str(k)), query=MONITORING, params=bind(PARAMS), trigger_s=0.2, sink=sink(broker, f"a.p{k}"))
    with pytest.raises(TaskError, match="already running"):
        host.start_task("p0", source("0"), query=MONITORING, sink=sink(broker, "a.p0"))
    with pytest.raises(TaskError, match="names no query"):
        host.start_task("p2", source("0"), sink=sink(broker, "a.p2"))
    with pytest.raises(TaskError, match="bad task id"):
        host.start_task("../x", source("0"), sink=sink(broker, "a.p0"))
    with pytest.raises(TaskError, match="not a share of a broker stream"):
        host.start_task("p9", "/streams/a/partition=0", sink=sink(broker, "a.p9"))
    newest = {t.task_id: t.source.newest_seq() for t in host.tasks()}  # of each task's key groups: where its reading ends
    assert len(set(newest.values())) == 2 and all(0 < seq <= broker.last_seq() for seq in newest.values())
    wait_for(lambda: all(t.position == newest[t.task_id] for t in host.tasks()))
    interval = host.sample()
    loads = host.loads(window_s=60)
    assert set(loads) == {"p0", "p1"} and all(0 < v <= 1.5 for v in loads.values())
    assert interval.batches > 0 and interval.utilisation > 0
    assert interval.cpu_utilisation is not None and interval.cpu_utilisation > 0
    batches = host.recorder.samples()
    assert batches and all(b.cpu_s is not None and b.cpu_s >= 0 for b in batches)
    assert 0 < interval.task_cpu_utilisation <= interval.cpu_utilisation * 1.5, "task CPU is part of the process CPU"

    server = StatusServer(host)
    url = server.start()
    try:
        status = httpx.get(f"{url}/status", timeout=30).json()
        assert {t["task_id"] for t in status["tasks"]} == {"p0", "p1"}
        assert all(t["backlog"] == {"pending": 0, "unit": "messages"} and t["state"] == "running" for t in status["tasks"])
        assert status["cpus"] == 2 and "marginal" in status["marginal_costs"]
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        assert 'bpm_task_load{task="p0"}' in metrics and 'bpm_task_batches_total{task="p0"}' in metrics
        assert "bpm_load " in metrics and 'bpm_task_batch_duration_seconds_bucket{le="+Inf",task="p0"}' in metrics
    finally:
        server.stop()


def test_cost_function_is_fitted_from_intervals_and_falls_back_without_samples(host):
    assert host.cost_function().fallback_used
    for i, u in enumerate([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]):
        host.intervals.append(IntervalSample(i, i + 1, {"a": u}, u, u, u, None, 0.2 / (1 - u), 3, 100))
    model = host.cost_function()
    assert isinstance(model, CostFunction) and not model.fallback_used
    costs = host.marginal_costs({"a": 0.3, "b": 0.2})
    assert costs["load"] == 0.5
    assert costs["tasks"]["a"]["shed"] <= costs["marginal"] <= costs["tasks"]["a"]["take"]
